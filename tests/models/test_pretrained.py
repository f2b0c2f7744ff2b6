"""The shipped GPT: loads with weights_only, matches its provenance, and writes Shakespeare-like text."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from scalekit.data import CharTokenizer, corpus_text, load_tokens
from scalekit.errors import ConfigError
from scalekit.models import GPT, PRETRAINED_NAMES, load_pretrained, pretrained_info
from scalekit.models import pretrained as pretrained_mod
from scalekit.models.pretrained import position_losses, state_dict_sha256

NAME = "shakespeare-char"


@pytest.fixture(scope="module")
def model() -> GPT:
    return load_pretrained(NAME)


@pytest.fixture(scope="module")
def info() -> dict:
    return pretrained_info(NAME)


@pytest.fixture(scope="module")
def tokenizer() -> CharTokenizer:
    return CharTokenizer(corpus_text())


def test_the_weights_are_plain_fp32_tensors_loadable_with_weights_only():
    path = pretrained_mod.WEIGHTS_DIR.joinpath("shakespeare_char.pt")
    with path.open("rb") as f:
        state = torch.load(f, map_location="cpu", weights_only=True)
    assert all(isinstance(t, torch.Tensor) and t.dtype == torch.float32 for t in state.values())
    assert 1 < path.stat().st_size / 2**20 < 8  # a few MB


def test_the_model_matches_its_provenance(model, info, tokenizer):
    assert NAME in PRETRAINED_NAMES
    config = dataclasses.asdict(model.config)
    # fields GPTConfig gained after the model was trained are at their defaults (they change nothing it computes)
    later = {f.name: f.default for f in dataclasses.fields(model.config) if f.name not in info["config"]}
    assert config == {**info["config"], **later}
    assert not model.training
    assert sum(p.numel() for p in model.parameters()) == info["parameters"]
    assert state_dict_sha256(model.state_dict()) == info["state_dict_sha256"]
    assert info["tokenizer"]["chars"] == tokenizer.chars
    assert model.config.vocab_size == tokenizer.vocab_size
    for key in ("phases", "steps", "tokens_seen", "seed", "lr_schedule", "wall_s"):
        assert key in info["training"], key
    assert info["training"]["seed"] is not None and info["script"] == "scripts/train_shipped_model.py"


def test_the_held_out_loss_re_measured_on_the_quick_slice_matches_the_record(model, info):
    quick = info["quick_check"]
    assert quick["split"] == "val" and quick["seq_len"] == model.config.block_size
    sums, n = position_losses(model, load_tokens("val"), quick["seq_len"], quick["n_windows"])
    loss = sums.sum().item() / (n * quick["seq_len"])
    assert loss == pytest.approx(quick["loss_nats_per_char"], abs=2e-3)
    assert loss <= 1.9
    assert info["heldout_loss_nats_per_char"] <= 1.9
    # every position of the context is trained (a model trained at 256 and barely at 1024 scores ≈2.5
    # past position 256); the last quarter is weaker (≈1.9-2.1 from position ≈830 on), recorded as it is
    quarters = [q.mean().item() / n for q in sums.chunk(4)]
    assert max(quarters) <= 2.1, quarters
    assert max(info["heldout_loss_by_position_quarter"]) <= 2.0, info["heldout_loss_by_position_quarter"]


def test_both_attention_implementations_give_the_same_logits(model):
    sdpa = GPT(dataclasses.replace(model.config, attention="sdpa"))
    sdpa.load_state_dict(model.state_dict())
    x = load_tokens("val")[:129]
    x = torch.from_numpy(x.astype("int64"))[None]
    with torch.no_grad():
        torch.testing.assert_close(sdpa.eval()(x)[0], model(x)[0], atol=1e-4, rtol=1e-4)


def english_share(text: str, words: set[str]) -> float:
    found = text.split()
    return sum(w in words for w in found) / max(1, len(found))


@pytest.mark.parametrize("mode", ["greedy", "seeded"])
def test_samples_from_romeo_read_like_shakespeare(model, tokenizer, mode):
    train_words = set(tokenizer.decode(load_tokens("train")).split())
    idx = torch.tensor([tokenizer.encode("ROMEO:")])
    if mode == "greedy":
        out = model.generate(idx, 300, top_k=1)  # top_k=1: the most likely character every step
    else:
        out = model.generate(idx, 300, temperature=0.8, generator=torch.Generator().manual_seed(0))
    text = tokenizer.decode(out[0].tolist())
    assert len(text) == 306 and text.startswith("ROMEO:")
    assert len(text.split()) >= 30, text
    assert english_share(text, train_words) >= 0.7, text


def test_an_unknown_name_is_a_config_error_naming_the_allowed_values():
    with pytest.raises(ConfigError, match="shakespeare-char"):
        load_pretrained("gpt2")
    with pytest.raises(ConfigError, match="allowed"):
        pretrained_info("nope")


MARKS = []


def _mark():
    MARKS.append("unpickled")
    return {}


class Payload:
    """What an attacker would put into a weights file: unpickling it calls _mark."""

    def __reduce__(self):
        return (_mark, ())


@pytest.fixture
def weights_copy(tmp_path, monkeypatch):
    for suffix in (".pt", ".json"):
        with pretrained_mod.WEIGHTS_DIR.joinpath(f"shakespeare_char{suffix}").open("rb") as f:
            (tmp_path / f"shakespeare_char{suffix}").write_bytes(f.read())
    monkeypatch.setattr(pretrained_mod, "WEIGHTS_DIR", tmp_path)
    return tmp_path / "shakespeare_char.pt"


def test_a_tampered_weights_file_with_a_pickled_object_is_refused(weights_copy):
    state = torch.load(weights_copy, weights_only=True)
    torch.save({**state, "payload": Payload()}, weights_copy)
    with pytest.raises(RuntimeError, match="shakespeare_char.pt") as err:
        load_pretrained(NAME)
    assert MARKS == [], "the pickled object ran"
    assert "\n" not in str(err.value)


def test_a_missing_or_corrupt_weights_file_is_one_line_naming_the_path(weights_copy):
    weights_copy.write_bytes(b"not a torch file")
    with pytest.raises(RuntimeError, match=re.escape(str(weights_copy))) as err:
        load_pretrained(NAME)
    assert "\n" not in str(err.value)
    weights_copy.unlink()
    with pytest.raises(RuntimeError, match=re.escape(str(weights_copy))) as err:
        load_pretrained(NAME)
    assert "\n" not in str(err.value)

