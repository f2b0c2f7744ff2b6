"""The dtype MFU is read against: one rule (scalekit.measure.flops.mfu_dtype) for scalekit's runs and for a
Trainer run measured by the callback, which reads it from the toggles its arguments map to."""

from __future__ import annotations

import pytest
import torch

from scalekit.measure.flops import mfu_dtype
from tests.helpers import CPU, built, tiny


def test_the_dtype_is_what_the_matmuls_compute_in():
    assert mfu_dtype(torch.bfloat16, tf32_matmuls=False) == mfu_dtype(torch.bfloat16, tf32_matmuls=True) == "bf16"
    assert mfu_dtype(torch.float16, tf32_matmuls=False) == "fp16"
    assert mfu_dtype(None, tf32_matmuls=True) == "tf32"  # float32 matmuls that the process lets run as TF32
    assert mfu_dtype(None, tf32_matmuls=False) == mfu_dtype(torch.float32, tf32_matmuls=False) == "fp32"


@pytest.mark.parametrize("toggles", [{}, {"bf16": True}, {"fp16": True}], ids=["fp32", "bf16", "fp16"])
def test_a_trainer_run_reads_the_dtype_a_run_with_its_toggles_builds(toggles):
    from scalekit.hf.callback import mfu_dtype_of  # in the test: it imports transformers' TrainerCallback

    with built(tiny(toggles=toggles)) as ctx:
        ran = mfu_dtype(ctx.compute_dtype, ctx.tf32_matmuls)
    assert mfu_dtype_of(toggles, CPU.device) == ran == (next(iter(toggles)) if toggles else "fp32")


def test_reading_the_trainer_runs_dtype_leaves_the_process_flags_as_they_were():
    from scalekit.hf.callback import mfu_dtype_of

    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    assert mfu_dtype_of({"tf32": True}, CPU.device) == "tf32"
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before
