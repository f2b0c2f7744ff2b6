"""tf32: sets torch's TF32 flags for the run and puts them back after; unavailable on a CPU."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from scalekit import run
from scalekit.toggles import TOGGLES
from tests.helpers import CPU, learns, tiny

STEPS = dict(steps=30, warmup_steps=1, log_every=5)


def test_tf32_sets_and_restores_the_flags_cpu_proxy():
    # CPUs have no TF32: pretend the hardware has it, to check the toggle's own work on this machine
    ampere = dataclasses.replace(CPU, tf32_supported=True)
    assert not TOGGLES["tf32"].available(CPU)[0]
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    seen = {}

    def spy(record):
        seen["flags"] = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32

    result = run(tiny(toggles=["tf32"], **STEPS), hw=ampere, on_step=spy)
    assert seen["flags"] == (True, True)
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before
    assert learns(result)


@pytest.mark.gpu
def test_tf32_on_gpu_runs():
    result = run(tiny(toggles=["tf32"], device="cuda", **STEPS))
    assert learns(result)
