"""sequence_packing: packed rows give every document the loss it has alone (≤ 1e-5 relative), a run over a
variable-length dataset counts real tokens only, and what cannot pack says why in one line."""

from __future__ import annotations

import pytest
import torch

from scalekit import ConfigError, RunConfig, ToggleUnavailable, run
from scalekit.data.packing import IGNORE, MAX_SHORT_DOCUMENTS_IN_A_ROW, PackedDocuments, pack_row, real_tokens
from tests.forking import deadline
from tests.helpers import NanoStyleGPT, nano_loss

pytestmark = pytest.mark.filterwarnings("ignore")


class Documents(torch.utils.data.Dataset):
    """Tokenized documents of 2 to 20 tokens."""

    def __init__(self, n: int = 40, vocab: int = 60, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.docs = [torch.randint(0, vocab, (int(torch.randint(2, 21, (), generator=g)),), generator=g) for _ in range(n)]

    def __len__(self):
        return len(self.docs)

    def __getitem__(self, i):
        return {"input_ids": self.docs[i]}


def _hf(family, attention):
    from scalekit.hf import causal_lm

    adapter = causal_lm(family, preset="tiny")
    adapter.attn_implementation = attention
    return adapter


def per_token_losses(logits, ids):
    return torch.nn.functional.cross_entropy(logits[:-1].float(), ids[1:], reduction="none")


@pytest.mark.parametrize("family,attention", [("llama", "eager"), ("llama", "sdpa"), ("gpt2", "sdpa")])
def test_each_documents_loss_packed_equals_its_loss_alone(family, attention):
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = _hf(family, attention).build().eval()
    docs = Documents(3).docs
    row = pack_row(docs, 64)
    with torch.no_grad():
        packed = model(**{k: v[None] for k, v in row.items() if k != "labels"}).logits[0]
        start = 0
        for doc in docs:
            alone = per_token_losses(model(input_ids=doc[None]).logits[0], doc)
            together = per_token_losses(packed[start:start + len(doc)], doc)
            torch.testing.assert_close(together, alone, rtol=1e-5, atol=1e-6)
            start += len(doc)
        # and the batch's loss (transformers' own, from the labels) is the unpacked batch's
        padded = torch.nn.utils.rnn.pad_sequence(docs, batch_first=True)
        mask = torch.nn.utils.rnn.pad_sequence([torch.ones_like(d) for d in docs], batch_first=True)
        unpacked = model(input_ids=padded, attention_mask=mask, labels=padded.masked_fill(mask == 0, IGNORE)).loss
        packed_loss = model(**{k: v[None] for k, v in row.items()}).loss
    assert abs(packed_loss.item() - unpacked.item()) <= 1e-5 * unpacked.item()


def test_rows_hold_whole_documents_and_count_only_real_tokens():
    data = Documents(40)
    rows = iter(PackedDocuments(data, 32, seed=0))
    batch = torch.utils.data.default_collate([next(rows) for _ in range(4)])
    assert batch["input_ids"].shape == (4, 32) and batch["attention_mask"].shape == (4, 1, 32, 32)
    lengths = sorted(len(d) for d in data.docs)
    starts = int(((batch["position_ids"] == 0) & (torch.nn.functional.pad(batch["position_ids"][:, 1:], (0, 1)) == 1)).sum())
    assert real_tokens(batch) == int((batch["labels"] != IGNORE).sum()) + starts  # every real token but a first is a target
    assert real_tokens(batch) > 0.7 * batch["input_ids"].numel()  # 2–20-token documents fill rows of 32 well
    assert lengths[0] >= 2


def test_a_run_packs_and_counts_real_tokens_per_second():
    pytest.importorskip("transformers")
    from scalekit.hf import causal_lm

    cfg = dict(model=causal_lm("llama", preset="tiny"), dataset=Documents(40), seq_len=32, batch_size=4, device="cpu",
               steps=3, warmup_steps=1, log_every=1)
    result = run(RunConfig(**cfg, toggles=["sequence_packing"]))
    assert result.status == "ok", result.error
    measured = [s for s in result.steps if not s.warmup]
    assert all(0 < s.tokens < 4 * 32 for s in measured), measured  # each batch's real tokens, padding left out
    assert result.tokens_per_step == round(sum(s.tokens for s in measured) / len(measured))  # what the steps held
    rates = sorted(s.tokens / (s.step_ms / 1e3) for s in measured)
    assert rates[0] * 0.999 <= result.tokens_per_s <= rates[-1] * 1.001


def test_without_a_dataset_it_changes_nothing_and_says_why():
    result = run(RunConfig(preset="tiny", device="cpu", steps=1, warmup_steps=0, toggles=["sequence_packing"]))
    assert result.status == "ok"
    assert any("sequence_packing changes nothing without RunConfig.dataset" in n for n in result.notes)


def test_a_model_of_your_own_is_refused_in_one_line_naming_it():
    with pytest.raises(ToggleUnavailable, match="sequence_packing.*NanoStyleGPT") as refused:
        RunConfig(model=NanoStyleGPT, dataset=Documents(4), loss_fn=nano_loss, device="cpu",
                  toggles=["sequence_packing"])
    assert "\n" not in str(refused.value)


def test_the_plan_traces_a_packed_batch():
    pytest.importorskip("transformers")
    from scalekit import estimate
    from scalekit.hf import causal_lm

    cfg = RunConfig(model=causal_lm("llama", preset="tiny"), dataset=Documents(40), seq_len=32, batch_size=4,
                    device="cpu", steps=1, warmup_steps=0, toggles=["sequence_packing"])
    planned, measured = estimate(cfg), run(cfg)
    assert abs(planned.peak_bytes - measured.peak_mem_bytes) < 0.15 * measured.peak_mem_bytes


def pad_documents(samples):
    ids = torch.nn.utils.rnn.pad_sequence([s["input_ids"] for s in samples], batch_first=True)
    mask = torch.nn.utils.rnn.pad_sequence([torch.ones_like(s["input_ids"]) for s in samples], batch_first=True)
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, IGNORE)}


def test_a_padded_run_counts_its_real_tokens_too():
    pytest.importorskip("transformers")
    from scalekit.hf import causal_lm

    data = Documents(8)
    result = run(RunConfig(model=causal_lm("llama", preset="tiny"), dataset=data, collate_fn=pad_documents, batch_size=8,
                           seq_len=32, device="cpu", steps=1, warmup_steps=0))
    assert result.status == "ok", result.error
    assert result.steps[0].tokens == sum(len(d) for d in data.docs)  # one batch: every document, no padding


# -- what could never fill a row is refused, not read forever -------------------------------------------------
HANG_DEADLINE_S = 5  # the fault is a hang (a loop at 100% CPU, which the Lab's Stop cannot end): fail fast


class Endless(torch.utils.data.IterableDataset):
    """An iterable dataset without end, of documents of `tokens` tokens."""

    def __init__(self, tokens: int):
        self.tokens = tokens

    def __iter__(self):
        while True:
            yield {"input_ids": torch.arange(self.tokens)}


def one_token_documents(n: int) -> list[dict]:
    return [{"input_ids": torch.tensor([i % 7])} for i in range(n)]


def test_rows_of_one_token_are_refused_before_anything_is_read():
    with deadline(HANG_DEADLINE_S, "still packing"), pytest.raises(ConfigError, match=r"RunConfig\.seq_len=1 .*at least 2 tokens"):
        PackedDocuments(Endless(5), 1, seed=0)
    pytest.importorskip("transformers")
    from scalekit.hf import causal_lm

    # a whole run, refused by the toggle before the model is built: its deadline leaves room for the first
    # imports of torch's compiler stack a run makes (seconds on a busy machine)
    with deadline(60, "still packing"), pytest.raises(ConfigError, match=r"RunConfig\.seq_len=1 .*set seq_len to 2"):
        run(RunConfig(model=causal_lm("llama", preset="tiny"), dataset=Documents(8), seq_len=1, batch_size=2,
                      device="cpu", steps=1, warmup_steps=0, toggles=["sequence_packing"]))


def test_a_dataset_with_no_document_of_two_tokens_is_refused_with_its_numbers():
    with deadline(HANG_DEADLINE_S, "still packing"):
        with pytest.raises(ConfigError, match=r"RunConfig\.dataset: .*no document of at least 2 tokens in a whole "
                                              r"pass over its 50 documents \(the longest has 1 token\)"):
            next(iter(PackedDocuments(one_token_documents(50), 8, seed=0)))
        with pytest.raises(ConfigError, match=f"in {MAX_SHORT_DOCUMENTS_IN_A_ROW:,} documents in a row"):
            next(iter(PackedDocuments(Endless(1), 8, seed=0)))  # an endless one: refused after a bounded read
        # one document of two tokens among them is enough: rows of it come out, not a refusal
        rows = iter(PackedDocuments([*one_token_documents(50), {"input_ids": torch.tensor([3, 4])}], 8, seed=0))
        row = next(rows)
    assert row["input_ids"].tolist() == [3, 4] * 4  # the one document, pass after pass
    assert row["position_ids"].tolist() == [0, 1] * 4
