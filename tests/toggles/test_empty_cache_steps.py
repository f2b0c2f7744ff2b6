"""empty_cache_steps: unavailable on the CPU with the reason; empties the allocator's cache every N steps
(counted on the CPU through a stand-in, and on a GPU where there is one)."""

from __future__ import annotations

import pytest
import torch

from scalekit import RunConfig, ToggleUnavailable, run
from scalekit.toggles import TOGGLES
from tests.helpers import CPU, built, tiny


def test_empty_cache_is_unavailable_on_cpu_with_the_reason():
    ok, why = TOGGLES["empty_cache_steps"].available(CPU)
    assert not ok and "CPU" in why and "cache" in why
    with pytest.raises(ToggleUnavailable, match="empty_cache_steps.*no cache to empty"):
        run(tiny(toggles={"empty_cache_steps": 2}))


def test_empty_cache_every_n_steps_cpu_proxy(monkeypatch):
    # the hook's own logic, on this machine: count the calls it would make on a GPU
    calls = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append(True))
    with built(tiny()) as ctx:
        TOGGLES["empty_cache_steps"].apply(ctx, 3)
        for step in range(10):
            for hook in ctx.after_step:
                hook(step)
    assert len(calls) == 3  # after steps 3, 6 and 9 (counted from 1)


@pytest.mark.gpu
def test_empty_cache_runs_on_gpu_and_is_called(monkeypatch):
    calls = []
    real = torch.cuda.empty_cache
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: (calls.append(True), real()))
    result = run(RunConfig(preset="tiny", device="cuda", steps=8, warmup_steps=0, log_every=4,
                           toggles={"empty_cache_steps": 2}))
    assert result.status == "ok" and len(calls) >= 4
