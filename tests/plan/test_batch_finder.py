"""find_batch_size: the batch it returns runs within the budget, and its double does not."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from scalekit import ConfigError, RunConfig, find_batch_size, run
from tests.helpers import Regressor, mse_loss, regression_batch

BUDGET = 20 * 2**20  # the tiny GPT's step peaks at ≈6.5 MiB for 8 sequences of 64 characters


def peak_at(config: RunConfig, batch_size: int) -> int:
    cfg = RunConfig(**{**config.to_dict(), "batch_size": batch_size, "steps": 1, "warmup_steps": 0})
    result = run(cfg)
    assert result.status == "ok"
    return result.peak_mem_bytes


def test_found_batch_runs_within_the_budget_and_its_double_does_not():
    config = RunConfig(preset="tiny", device="cpu")
    search = find_batch_size(config, budget_bytes=BUDGET)
    b = search.batch_size
    assert b >= 8 and b % 8 == 0  # a multiple of 8
    assert [t.batch_size for t in search.trials][:5] == [1, 2, 4, 8, 16]  # powers of two first
    assert peak_at(config, b) <= BUDGET  # it runs, within the budget
    assert peak_at(config, 2 * b) > BUDGET  # its double does not fit
    assert {t.why for t in search.trials} <= {"fits", "over budget"}
    table = search.table()
    assert list(table.columns) == ["batch_size", "fits", "why", "peak_mem_mb"] and len(table) == len(search.trials)


def test_accumulation_keeps_every_batch_tried_a_multiple_of_k():
    # 8 MiB: without accumulation 8 sequences fit and 16 do not
    search = find_batch_size(RunConfig(preset="tiny", device="cpu", toggles={"grad_accum": 4}),
                             budget_bytes=8 * 2**20)
    assert all(t.batch_size % 4 == 0 for t in search.trials)
    assert search.batch_size % 4 == 0 and search.batch_size >= 16  # accumulation lets a larger batch fit


class Greedy(Regressor):
    """Allocates a large buffer in forward and runs 'out of memory' above 12 samples."""

    scratch_refs: list = []

    def forward(self, x):
        scratch = torch.empty(4 * 2**20)  # 16 MiB the failed step holds
        Greedy.scratch_refs.append(weakref.ref(scratch))
        if x.shape[0] > 12:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {x.shape[0]} samples")
        return super().forward(x) + 0 * scratch[0]


def test_out_of_memory_is_caught_and_its_memory_released():
    Greedy.scratch_refs.clear()
    config = RunConfig(model=Greedy, batch_fn=regression_batch, loss_fn=mse_loss, device="cpu")
    search = find_batch_size(config, budget_bytes=2**30)
    assert search.batch_size == 8  # 16 ran out of memory; nothing between 8 and 16 in steps of 8
    failed = [t for t in search.trials if not t.fits]
    assert [t.batch_size for t in failed] == [16] and failed[0].why.startswith("out of memory")
    gc.collect()
    assert Greedy.scratch_refs and all(ref() is None for ref in Greedy.scratch_refs)  # nothing the failed step held lives


def test_finder_refuses_what_it_cannot_do():
    with pytest.raises(ConfigError, match="budget_bytes is required on a CPU"):
        find_batch_size(RunConfig(preset="tiny", device="cpu"))
    with pytest.raises(ConfigError, match="even batch_size=1 does not fit"):
        find_batch_size(RunConfig(preset="tiny", device="cpu"), budget_bytes=2**20)
    with pytest.raises(ConfigError, match="multiple of grad_accum=4"):
        find_batch_size(RunConfig(preset="tiny", device="cpu", toggles={"grad_accum": 4}), budget_bytes=BUDGET, start=6)


def test_other_errors_are_not_mistaken_for_out_of_memory():
    class Broken(Regressor):
        def forward(self, x):
            raise ValueError("a bug, not a memory problem")

    config = RunConfig(model=Broken, batch_fn=regression_batch, loss_fn=mse_loss, device="cpu")
    with pytest.raises(ValueError, match="a bug"):
        find_batch_size(config, budget_bytes=2**30)


@pytest.mark.gpu
def test_finder_on_gpu_with_a_budget():
    config = RunConfig(preset="small", device="cuda")
    search = find_batch_size(config, budget_bytes=256 * 2**20)
    b = search.batch_size
    assert run(RunConfig(preset="small", device="cuda", batch_size=b, steps=1, warmup_steps=0)).peak_mem_bytes \
        <= 256 * 2**20
    double = run(RunConfig(preset="small", device="cuda", batch_size=2 * b, steps=1, warmup_steps=0))
    assert double.peak_mem_bytes > 256 * 2**20
