"""compile='regional' captures its blocks' graph in training on every kind of model, not only the built-in GPT: the
built-in GPT, the nine Hugging Face families of tests/families.py, and a plain nn.Module whose blocks sit in an
nn.ModuleList under a name no library uses.  Two steps' losses (the second one after an update, so gradients count too) equal eager's.

The numeric tests compile with dynamo's "aot_eager" backend (the graphs traced and split into forward and backward
as inductor gets them, then run as they are): the capture and the wiring are tested in seconds; one slow test runs
inductor itself."""

from __future__ import annotations

import pytest
import torch

from scalekit import RunConfig, run
from tests.families import HF_FAMILIES, hf_model

STEPS = 2


class _Block(torch.nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 2 * d), torch.nn.GELU(), torch.nn.Linear(2 * d, d))

    def forward(self, x):
        return x + self.mlp(self.norm(x))


class PlainStack(torch.nn.Module):
    """A user's model: an embedding, blocks in an nn.ModuleList named `stack`, a head."""

    def __init__(self, vocab: int = 65, d: int = 32, n_blocks: int = 3):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d)
        self.stack = torch.nn.ModuleList(_Block(d) for _ in range(n_blocks))
        self.head = torch.nn.Linear(d, vocab)

    def forward(self, ids):
        x = self.embed(ids)
        for block in self.stack:
            x = block(x)
        return self.head(x)


def plain_batch(batch_size: int, device):
    return torch.randint(0, 65, (batch_size, 17), device=device)


def plain_loss(model, ids):
    logits = model(ids[:, :-1])
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def without_dropout(model: torch.nn.Module) -> torch.nn.Module:
    """Dropout off, so eager and compiled draw no random numbers and their losses can be compared exactly."""
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    return model


def config(kind: str, toggles: dict) -> RunConfig:
    common = dict(steps=STEPS, warmup_steps=0, log_every=1, device="cpu", measure_memory=False, toggles=toggles,
                  batch_size=4, seq_len=16)
    if kind == "gpt":
        return RunConfig(preset="tiny", data="synthetic", **common)
    if kind == "plain":
        return RunConfig(model=PlainStack, batch_fn=plain_batch, loss_fn=plain_loss, **common)
    return RunConfig(model=without_dropout(hf_model(kind)), data="synthetic", **common)


@pytest.fixture
def aot_eager_blocks(monkeypatch):
    """Every block compiled by the regional toggle goes through dynamo's aot_eager backend, not inductor."""
    real = torch.nn.Module.compile
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kw: real(self, backend="aot_eager"))


@pytest.mark.parametrize("kind", ["gpt", *HF_FAMILIES, "plain"])
def test_regional_compile_captures_the_blocks_in_training_and_matches_eager(kind, aot_eager_blocks):
    eager = run(config(kind, {}))  # (each run seeds the generator its batches and weights come from)
    regional = run(config(kind, {"compile": "regional"}))
    assert eager.status == regional.status == "ok", (eager.error, regional.error)
    assert regional.graphs_compiled >= 1, regional.notes
    assert not any("captured no graph" in note for note in regional.notes)
    assert regional.flags == []  # not flagged as a compile that did nothing
    assert len(regional.losses) == len(eager.losses) == STEPS
    for (_, a), (_, b) in zip(regional.losses, eager.losses, strict=True):
        assert abs(a - b) <= 1e-5 * abs(b), (kind, regional.losses, eager.losses)


def test_a_compile_that_captures_nothing_is_flagged_not_an_ordinary_ok_row(monkeypatch):
    """A model dynamo gives up on runs eagerly: the row says so in its flags, its note and the text table."""
    from scalekit.training.report import results_table

    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kw: None)  # compiles nothing, as if dynamo gave up
    result = run(config("plain", {"compile": "regional"}))
    assert result.status == "ok" and result.graphs_compiled == 0
    assert result.flags == ["compile no-op"]
    assert result.summary_row()["flags"] == "compile no-op"
    assert "NO-OP" in results_table([result]).splitlines()[2]


@pytest.mark.slow
def test_regional_compile_with_inductor_on_a_hugging_face_llama():
    eager = run(config("llama", {}))
    regional = run(config("llama", {"compile": "regional"}))
    assert regional.status == "ok" and regional.graphs_compiled >= 1, (regional.error, regional.notes)
    for (_, a), (_, b) in zip(regional.losses, eager.losses, strict=True):
        assert abs(a - b) <= 1e-4 * abs(b)  # inductor fuses and reorders float sums
