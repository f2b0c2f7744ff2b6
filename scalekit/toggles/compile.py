"""torch.compile: trace the model into graphs and generate fused kernels for them."""

from __future__ import annotations

import torch

from ..checks import check_bool
from ..errors import (
    CompileFailed,
    ConfigError,
    ToggleUnavailable,
    compile_failure_in,
    is_out_of_memory,
    torch_compile_says,
)
from ..machine.cxx import unavailable_reason
from .base import BuildContext, Spelling, Toggle, Tune

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
REGIONAL = "regional"  # each repeated block compiled (one graph reused by every block), not the whole model


class Compile(Toggle):
    name = "compile"
    summary = "torch.compile the model: fused kernels, fewer trips to memory"
    cost = "seconds to minutes of compile time on the first steps; recompiles when shapes change"
    helps_when = "memory-bound elementwise chains (GELU, norms, residual adds) dominate; GPU models of some size"
    group = "compile"
    phase = "wrap"
    loops = ("train", "generate")
    choices = (*COMPILE_MODES, REGIONAL)
    tuning = (Tune("default", rank=70, uninterruptible=True),
              Tune("default", rank=60, loop="generate", uninterruptible=True))
    plan_note = 'compile fuses ops and can keep less; this plan is for eager execution'

    def available(self, hw) -> tuple[bool, str]:
        if not torch._dynamo.is_dynamo_supported():
            return False, "torch.compile does not support this Python version"
        if hw.device_type == "cpu" and (why := unavailable_reason()):
            return False, why
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
        ctx.stack.push(said_in_one_line(value, type(ctx.base_model).__name__, ctx.blocks is not None))
        if value == REGIONAL:
            if ctx.blocks is None:
                raise ToggleUnavailable(f"compile='regional' compiles each repeated block, and "
                                        f"{type(ctx.base_model).__name__} has no nn.ModuleList or nn.Sequential of "
                                        f"blocks: use compile='default' (the whole model)")
            compile_blocks(ctx.blocks)
            ctx.notes.append(f"regional compile: each of {len(ctx.blocks)} blocks compiled, the rest eager")
        else:
            ctx.model = torch.compile(ctx.model, mode=value)
        ctx.compiled = True

    # Framework spellings: Trainer arguments, accelerate, Lightning
    training_fields = {"torch_compile": False, "torch_compile_mode": None, "torch_compile_backend": None}

    def from_training_arguments(self, fields, notes) -> str | None:
        check_bool("TrainingArguments", "torch_compile", fields["torch_compile"])
        mode, backend = fields["torch_compile_mode"], fields["torch_compile_backend"]
        if mode is not None and (not isinstance(mode, str) or mode not in COMPILE_MODES):
            raise ConfigError(f"TrainingArguments.torch_compile_mode={mode!r} is not a mode scalekit's compile toggle "
                              f"takes; allowed: {', '.join(COMPILE_MODES)}")
        if backend is not None and not isinstance(backend, str):
            raise ConfigError(f"TrainingArguments.torch_compile_backend must be a backend's name or None, got {backend!r}")
        if not (fields["torch_compile"] or mode or backend):
            return None
        if backend not in (None, "inductor"):
            notes.append(f"torch_compile_backend={backend!r} not mapped: scalekit compiles with inductor")
        return mode or "default"

    def spelling(self, target, mode: str, cfg) -> Spelling:
        if mode == REGIONAL:
            return Spelling(missing="regional compile is `block.compile()` on each of the model's repeated blocks, "
                                    "which the framework's compile switch does not offer")
        if target == "hf":
            return Spelling(kwargs={"torch_compile": True, "torch_compile_backend": "inductor",
                                    **({"torch_compile_mode": mode} if mode != "default" else {})})
        if target == "accelerate":
            return Spelling(kwargs={"dynamo_plugin": f'TorchDynamoPlugin(backend="inductor", mode={mode!r})'},
                            imports=("from accelerate.utils import TorchDynamoPlugin",))
        return Spelling(wrap=(f"self.model = torch.compile(self.model, mode={mode!r})",))


def compile_blocks(blocks) -> None:
    """Compile each block in place (nn.Module.compile: its names, state_dict and hooks unchanged).  Blocks of one
    class share their code, and dynamo treats their weights as inputs, so the first block's graph serves the rest."""
    for block in blocks:
        block.compile()


def ways_out(mode: str, has_blocks: bool) -> str:
    """The other ways to run a model whose compile failed in `mode`: a gentler mode, and no compile at all."""
    others = [m for m in ("default", REGIONAL) if m != mode and (m != REGIONAL or has_blocks)]
    return f"try {' or '.join(f'compile={m!r}' for m in others)}, or run without compile"


def said_in_one_line(mode: str, model_name: str, has_blocks: bool):
    """An exit callback for the run's stack: a failure torch.compile raised while the run unwinds (compiling, or at
    a compiled call, in training or generation) is raised again as CompileFailed, in one line naming the mode, the
    model's class and the way out, torch's exception chained beneath it for whoever debugs torch."""

    def translate(exc_type, exc, tb) -> bool:
        failure = compile_failure_in(exc)
        if failure is None or is_out_of_memory(exc):  # not compile's, or memory: said as what it is
            return False
        raise CompileFailed(f"compile={mode!r} failed on {model_name}: torch.compile raised "
                            f"{torch_compile_says(failure)}; {ways_out(mode, has_blocks)}") from exc

    return translate


TOGGLE = Compile()
