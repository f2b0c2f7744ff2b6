"""The wait for data: measured apart from the step it belongs to, right for a loader of known speed, and
without a sync point of its own."""

from __future__ import annotations

import statistics
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from scalekit import RunConfig, run
from scalekit.measure import timing
from scalekit.training.report import results_table
from tests.helpers import Regressor, mse_loss, regression_batch, tiny

SLEEP_MS = 30


class SleepyDataset(Dataset):
    """A dataset whose every sample sleeps, recording how long each fetch really took (sleep overshoots)."""

    def __init__(self, took_ms: list):
        self.took_ms = took_ms

    def __len__(self):
        return 10**6

    def __getitem__(self, i):
        t0 = time.perf_counter()
        time.sleep(SLEEP_MS / 1e3)
        x = torch.randn(16)
        self.took_ms.append((time.perf_counter() - t0) * 1e3)
        return x, x.sum()


def sleepy_run(kind: str, took_ms: list, **kwargs):
    if kind == "batch_fn":
        def batch_fn(batch_size, device):
            t0 = time.perf_counter()
            time.sleep(SLEEP_MS / 1e3)
            batch = regression_batch(batch_size, device)
            took_ms.append((time.perf_counter() - t0) * 1e3)
            return batch
    else:  # a real DataLoader (one sample per batch, so one sleep per batch)
        batches = iter(DataLoader(SleepyDataset(took_ms), batch_size=1))

        def batch_fn(batch_size, device):
            x, y = next(batches)
            return x.to(device), y.to(device)
    return run(RunConfig(model=Regressor, batch_fn=batch_fn, loss_fn=mse_loss, batch_size=1, steps=8,
                         warmup_steps=1, log_every=4, device="cpu", measure_memory=False, **kwargs))


@pytest.mark.parametrize("kind", ["batch_fn", "DataLoader"])
def test_a_loader_that_sleeps_a_known_time_is_measured_within_10_percent(kind):
    took_ms: list[float] = []
    result = sleepy_run(kind, took_ms)
    assert result.status == "ok", result.error
    measured = [s for s in result.steps if not s.warmup]
    assert len(measured) == 8 and all(s.data_wait_ms is not None for s in measured)
    # against what the loader itself measured (its sleeps), step by step, and their median
    assert result.data_wait_ms.median == pytest.approx(statistics.median(took_ms[-8:]), rel=0.10)
    assert result.data_wait_ms.median == pytest.approx(SLEEP_MS, rel=0.10) or result.data_wait_ms.median > SLEEP_MS
    for s in measured:
        assert SLEEP_MS <= s.data_wait_ms <= s.step_ms  # the step's time includes its wait
    share = sum(s.data_wait_ms for s in measured) / sum(s.step_ms for s in measured)
    assert result.data_wait_frac == pytest.approx(share) and 0.5 < share < 1  # the model's step is tiny


def test_a_pipeline_with_nothing_to_wait_for_waits_little():
    result = run(tiny(data="synthetic", steps=6))
    assert result.data_wait_ms.median < result.step_ms.median and result.data_wait_frac < 0.5


class FakeEvent:
    """A stand-in for torch.cuda.Event on a CPU machine: records host times and counts every call that waits."""

    calls: list[str] = []

    def __init__(self, enable_timing=False):
        self.t = None

    def record(self, stream=None):
        FakeEvent.calls.append("record")
        self.t = time.perf_counter()

    def synchronize(self):
        FakeEvent.calls.append("synchronize")

    def query(self):
        FakeEvent.calls.append("query")
        return True

    def elapsed_time(self, end):
        FakeEvent.calls.append("elapsed_time")
        return (end.t - self.t) * 1e3


def test_the_cuda_timer_marks_the_data_wait_with_an_event_and_waits_only_when_collected(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    FakeEvent.calls = []
    timer = timing.CUDAStepTimer(torch.device("cuda"))
    for _ in range(3):
        timer.start()
        time.sleep(0.01)
        timer.data_ready()
        timer.stop()
    assert set(FakeEvent.calls) == {"record"} and len(FakeEvent.calls) == 9  # three events a step, no wait
    steps, waits = timer.collect_with_waits()
    assert FakeEvent.calls.count("synchronize") == 1  # one wait, for the last event, at the sync point
    assert len(steps) == len(waits) == 3 and all(10 <= w <= s for w, s in zip(waits, steps, strict=True))


def test_the_measured_loop_waits_for_the_device_only_at_its_loss_reads(monkeypatch):
    # the engine's loop, run with the CUDA timer on fake events: it may wait only where it reads the loss
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr("scalekit.training.engine.step_timer", lambda device: timing.CUDAStepTimer(device))
    FakeEvent.calls = []
    result = run(tiny(steps=6, warmup_steps=1, log_every=2, measure_memory=False))
    assert result.status == "ok"
    assert FakeEvent.calls.count("record") == 3 * 7  # start, data ready, end: for each of the 7 steps
    assert FakeEvent.calls.count("synchronize") == len(result.losses) == 4  # warm-up step, then every 2nd
    assert "query" not in FakeEvent.calls
    assert all(s.data_wait_ms is not None and s.data_wait_ms <= s.step_ms for s in result.steps)


def test_results_compare_and_the_cli_table_show_the_wait():
    result = run(tiny(steps=4, data="synthetic", measure_memory=False))
    row = result.summary_row()
    assert row["data_wait_ms"] == result.data_wait_ms.median and row["data_wait_frac"] == result.data_wait_frac
    assert result.batches_fetched == len(result.steps) == 5 and row["steps_per_batch"] == 1
    doc = result.to_dict()
    assert doc["data_wait_ms"]["n"] == 4 and doc["steps_per_batch"] == 1
    from scalekit import compare

    frame = compare([result, result])
    assert {"data_wait_ms", "data_wait_frac", "steps_per_batch"} <= set(frame.columns)
    table = results_table([result])
    assert "data wait" in table.splitlines()[0] and f"{100 * result.data_wait_frac:.0f}%" in table
