"""Your own data: RunConfig(dataset=...) goes through the real DataLoader, every data toggle acts on it (the
same batches in the same order), data_wait is measured on it, and no worker outlives its run."""

from __future__ import annotations

import math
import re

import psutil
import pytest
import torch
from torch.utils.data import Dataset, IterableDataset

from scalekit import ConfigError, RunConfig, run
from scalekit.data import LoaderBatches, dataset_loader
from tests.helpers import CPU, NoisyWindows, TinyLM, built, lm_loss, one_thread

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_thread():
        yield




class Stream(IterableDataset):
    def __init__(self, n: int = 12, seq_len: int = 8):
        self.n, self.seq_len = n, seq_len

    def __iter__(self):
        for i in range(self.n):
            x = torch.full((self.seq_len,), i % 65)
            yield x, (x + 1) % 65






def own(dataset=None, **kwargs) -> RunConfig:
    base = dict(model=TinyLM, dataset=dataset if dataset is not None else NoisyWindows(), loss_fn=lm_loss,
                batch_size=6, tokens_per_sample=16, steps=3, warmup_steps=0, log_every=1, device="cpu",
                measure_memory=False)
    return RunConfig(**{**base, **kwargs})


def batches_of(cfg: RunConfig, n: int = 14) -> list:
    """The first n batches the run's pipeline gives (three epochs of 40 samples in batches of 6)."""
    with built(cfg) as ctx:
        return [next(ctx.batches) for _ in range(n)]


def assert_same(a: list, b: list) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        for s, t in zip(x, y, strict=True):
            assert torch.equal(s, t)


def test_workers_give_the_same_batches_in_the_same_order_across_epochs():
    serial = batches_of(own())
    assert_same(serial, batches_of(own(toggles={"dataloader_num_workers": 2})))
    # a new shuffle each epoch, the remainder carried over: not the same batch twice in a row
    assert not torch.equal(serial[0][0], serial[7][0])


def test_pinned_memory_gives_the_same_batches():
    # the toggle is for GPUs (it says so on a CPU); the DataLoader option itself is checked here
    with pytest.warns(UserWarning, match="pin_memory"):
        pinned = LoaderBatches(dataset_loader(NoisyWindows(), 6, 1337, pin_memory=True), torch.device("cpu"))
        got = [next(pinned) for _ in range(8)]
    pinned.close()
    plain = LoaderBatches(dataset_loader(NoisyWindows(), 6, 1337), torch.device("cpu"))
    assert_same(got, [next(plain) for _ in range(8)])


def test_drop_last_skips_each_epochs_remainder_and_data_echo_fetches_one_kth():
    dropped = batches_of(own(toggles={"drop_last": True}), n=12)
    # 40 samples in batches of 6: 6 full batches an epoch, the 4 left over skipped, never carried over
    for epoch in (dropped[:6], dropped[6:]):
        rows = torch.cat([x for x, _ in epoch])
        assert len({tuple(r.tolist()) for r in rows}) == 36
    result = run(own(steps=8, toggles={"data_echo": 2}))
    assert result.status == "ok" and result.batches_fetched == math.ceil(8 / 2)
    assert result.data_wait_ms is not None and 0 <= result.data_wait_frac < 1


def test_the_toggles_that_cannot_act_on_your_data_say_why():
    result = run(own(toggles={"training_format": True, "vectorized_transforms": True}))
    notes = " ".join(result.notes)
    assert "your dataset reads its samples itself" in notes and "its per-sample transforms are your code" in notes
    with_fn = run(RunConfig(model=TinyLM, batch_fn=lambda b, d: (torch.zeros(b, 4, dtype=torch.long),) * 2,
                            loss_fn=lm_loss, steps=1, warmup_steps=0, device="cpu", measure_memory=False,
                            toggles={"dataloader_num_workers": 2, "drop_last": True}))
    assert with_fn.status == "ok"
    assert any("batches your batch_fn makes" in n and "give RunConfig.dataset" in n for n in with_fn.notes)
    assert not any("changes the built-in GPT" in n for n in with_fn.notes)


def test_an_iterable_dataset_runs_pass_after_pass():
    result = run(own(dataset=Stream(), steps=5, batch_size=4, tokens_per_sample=8))
    assert result.status == "ok" and result.batches_fetched == 5  # 3 batches a pass: a second pass began
    with_workers = run(own(dataset=Stream(), steps=2, batch_size=4, tokens_per_sample=8,
                           toggles={"dataloader_num_workers": 1}))
    assert with_workers.status == "ok" and any("get_worker_info" in n for n in with_workers.notes)


def children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def gone(pids) -> bool:
    import time

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("ending", ["success", "failure", "ctrl-c"])
def test_no_worker_is_left_after_success_failure_or_ctrl_c(ending):
    seen: set[int] = set()
    calls = {"n": 0}

    def loss(model, batch):
        seen.update(children())
        calls["n"] += 1
        if calls["n"] == 3 and ending != "success":
            raise RuntimeError("a step failed") if ending == "failure" else KeyboardInterrupt
        return lm_loss(model, batch)

    result = run(own(loss_fn=loss, steps=4, toggles={"dataloader_num_workers": 2}), catch_errors=True)
    assert result.status == {"success": "ok", "failure": "failed", "ctrl-c": "stopped"}[ending], result.error
    assert len(seen) == 2 and gone(seen)


def test_a_dataset_is_refused_with_the_field_named():
    with pytest.raises(ConfigError, match="RunConfig.dataset and batch_fn both make the batches"):
        own(batch_fn=lambda b, d: None)
    with pytest.raises(ConfigError, match="RunConfig.dataset feeds your own model"):
        RunConfig(dataset=NoisyWindows())
    with pytest.raises(ConfigError, match="RunConfig.dataset must be a torch.utils.data.Dataset"):
        own(dataset=[1, 2, 3].__iter__())
    with pytest.raises(ConfigError, match="RunConfig.collate_fn goes with RunConfig.dataset"):
        RunConfig(model=TinyLM, batch_fn=lambda b, d: None, loss_fn=lm_loss, collate_fn=lambda x: x)


class EmptyStream(IterableDataset):
    def __iter__(self):
        return iter(())


def test_an_empty_iterable_dataset_is_said_naming_the_field():
    result = run(own(dataset=EmptyStream()), catch_errors=True)
    assert result.status == "failed" and "RunConfig.dataset" in result.error and "no sample" in result.error, \
        result.error
    assert "StopIteration" not in result.error


def test_a_collate_fn_that_returns_no_tensor_is_blamed_not_batch_fn():
    def weights_only(model, batch):  # a loss that reads no batch: the batch itself is what must be refused
        return model.out.weight.sum()

    for loss_fn in (lm_loss, weights_only):
        with pytest.raises(ConfigError, match=r"^RunConfig\.collate_fn returned a batch with no tensor"):
            run(own(collate_fn=lambda samples: [len(samples)], loss_fn=loss_fn))
    with pytest.raises(ConfigError, match=r"^RunConfig\.batch_fn returned a batch with no tensor"):  # its own
        run(RunConfig(model=TinyLM, batch_fn=lambda b, d: [b], loss_fn=weights_only, tokens_per_sample=16, steps=1,
                      warmup_steps=0, device="cpu", measure_memory=False))


@pytest.mark.parametrize("value,got", [(3, "int"), (None, "NoneType"), ("x", "a tensor of shape (6,)")])
def test_a_loss_fn_that_returns_no_scalar_tensor_is_said(value, got):
    def loss(model, batch):
        if value == "x":  # one loss per sample, not reduced
            x, y = batch
            return torch.nn.functional.cross_entropy(model(x).transpose(1, 2), y, reduction="none").mean(1)
        return value

    with pytest.raises(ConfigError, match=rf"RunConfig\.loss_fn must return a scalar tensor, got {re.escape(got)}$"):
        run(own(loss_fn=loss))


class Ragged(Dataset):
    """Documents of different lengths, as text usually comes."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int):
        x = torch.arange(5 + i % 4) % 65
        return x, x


def test_samples_of_different_lengths_are_said_in_words_and_a_padding_collate_runs_them():
    with pytest.raises(ConfigError, match="RunConfig.dataset: its samples have different lengths.*RunConfig.collate_fn"):
        run(own(dataset=Ragged()))

    def pad(samples):
        xs = torch.nn.utils.rnn.pad_sequence([x for x, _ in samples], batch_first=True)
        return xs, xs

    result = run(own(dataset=Ragged(), collate_fn=pad, tokens_per_sample=8))
    assert result.status == "ok", result.error


def test_a_hugging_face_model_trains_on_your_tokenized_dataset_with_its_own_loss():
    pytest.importorskip("transformers")
    from scalekit.hf import causal_lm

    spec = causal_lm("llama", preset="tiny")
    result = run(RunConfig(model=spec, dataset=NoisyWindows(as_dict=True), batch_size=4, steps=2, warmup_steps=0,
                           device="cpu", measure_memory=False, toggles={"dataloader_num_workers": 1}), hw=CPU)
    assert result.status == "ok", result.error
    assert result.tokens_per_step == 4 * 16 and math.isfinite(result.final_loss)
    assert result.batches_fetched == 2


def test_a_hugging_face_datasets_dataset_is_read_as_tensors():
    datasets = pytest.importorskip("datasets")
    pytest.importorskip("transformers")
    from scalekit.hf import causal_lm

    rows = {"input_ids": [[(i + j) % 65 for j in range(12)] for i in range(20)], "text": ["x"] * 20}
    ds = datasets.Dataset.from_dict(rows)  # in memory: nothing is downloaded
    result = run(RunConfig(model=causal_lm("gpt2", preset="tiny"), dataset=ds, batch_size=4, steps=2,
                           warmup_steps=0, device="cpu", measure_memory=False), hw=CPU)
    assert result.status == "ok", result.error
    assert result.tokens_per_step == 4 * 12


def test_from_training_arguments_maps_the_data_loader_fields_onto_your_train_dataset():
    pytest.importorskip("transformers")
    from scalekit.hf import causal_lm

    args = {"dataloader_num_workers": 2, "dataloader_drop_last": True, "per_device_train_batch_size": 4}
    cfg = RunConfig.from_training_arguments(args, model=causal_lm("llama"), train_dataset=NoisyWindows(as_dict=True),
                                            steps=2, warmup_steps=0, device="cpu", measure_memory=False)
    assert cfg.toggles["dataloader_num_workers"] == 2 and cfg.toggles["drop_last"] is True
    assert isinstance(cfg.dataset, NoisyWindows) and cfg.batch_size == 4
    result = run(cfg, hw=CPU)
    assert result.status == "ok" and result.batches_fetched == 2, result.error
    # without a dataset the same fields map onto the shipped corpus's loader, for a Hugging Face model too
    assert RunConfig.from_training_arguments({"dataloader_num_workers": 2},
                                             model=causal_lm("llama")).toggles["dataloader_num_workers"] == 2


def test_the_planner_traces_a_step_on_a_batch_of_your_dataset():
    import scalekit

    plan = scalekit.estimate(own())
    assert plan.method.startswith("traced") and plan.peak_bytes > plan.params_bytes > 0
