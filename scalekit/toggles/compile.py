"""torch.compile: trace the model into graphs and generate fused kernels for them."""

from __future__ import annotations

import torch

from ..hardware import c_compiler
from .base import BuildContext, Toggle, Tune

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


class Compile(Toggle):
    name = "compile"
    summary = "torch.compile the model: fused kernels, fewer trips to memory"
    cost = "seconds to minutes of compile time on the first steps; recompiles when shapes change"
    helps_when = "memory-bound elementwise chains (GELU, norms, residual adds) dominate; GPU models of some size"
    group = "compile"
    phase = "wrap"
    loops = ("train", "generate")
    choices = COMPILE_MODES
    tuning = (Tune("default", rank=70, uninterruptible=True),
              Tune("default", rank=60, loop="generate", uninterruptible=True))
    plan_note = 'compile fuses ops and can keep less; this plan is for eager execution'

    def available(self, hw) -> tuple[bool, str]:
        if not torch._dynamo.is_dynamo_supported():
            return False, "torch.compile does not support this Python version"
        if hw.device_type == "cpu" and c_compiler() is None:
            return False, "torch.compile on CPU needs a C++ compiler (g++ or clang++) on PATH"
        if hw.device_type == "cuda":
            try:
                import triton  # noqa: F401
            except ImportError:
                return False, "torch.compile on GPU needs triton, which is not installed"
        return True, ""

    def apply(self, ctx: BuildContext, value) -> None:
        # every run compiles afresh: compiled code and guards left by earlier runs in this process would
        # otherwise count against dynamo's recompile limit (past it, dynamo silently runs eagerly)
        torch._dynamo.reset()
        ctx.model = torch.compile(ctx.model, mode=value)
        ctx.compiled = True


TOGGLE = Compile()
