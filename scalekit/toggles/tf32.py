"""TF32: let fp32 matmuls and convolutions run on tensor cores with a 10-bit mantissa."""

from __future__ import annotations

import torch

from ..checks import bool_or_none
from .base import BuildContext, Spelling, Toggle, Tune


class TF32(Toggle):
    name = "tf32"
    summary = "fp32 matmuls on tensor cores in TF32 (10-bit mantissa, fp32 range)"
    cost = "matmul inputs rounded to ~3 significant digits; accumulation stays fp32"
    helps_when = "an Ampere or newer NVIDIA GPU runs fp32 matmuls (≈3× on A100)"
    group = "precision"
    phase = "process"
    loops = ("train", "generate")
    tuning = (Tune(rank=10),)
    plan_note = 'tf32 changes how matmuls round, not the size of any tensor'

    def available(self, hw) -> tuple[bool, str]:
        if hw.tf32_supported:
            return True, ""
        if hw.device_type != "cuda":
            return False, "TF32 is a tensor-core format of NVIDIA GPUs (Ampere, compute capability 8.0, or newer); this run is on the CPU"
        return False, f"TF32 needs compute capability 8.0 or newer; {hw.device_name} has {hw.capability}"

    def apply(self, ctx: BuildContext, value) -> None:
        # process-wide flags: remember them and put them back when the run ends
        before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)

        def restore() -> None:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before

        ctx.stack.callback(restore)
        ctx.tf32_matmuls = True  # MFU is then read against the device's TF32 peak
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


    def traced(self, value) -> bool:
        return True

    # Framework spellings: Trainer arguments, accelerate, Lightning
    training_fields = {"tf32": None}

    def from_training_arguments(self, fields, notes) -> bool | None:
        return bool_or_none("TrainingArguments", "tf32", fields["tf32"]) or None

    def spelling(self, target, value, cfg) -> Spelling:
        return {"hf": Spelling(kwargs={"tf32": True}, gpu_only=True),  # TrainingArguments refuses it without an Ampere GPU
                "accelerate": Spelling(setup=("torch.backends.cuda.matmul.allow_tf32 = True  # tf32",
                                              "torch.backends.cudnn.allow_tf32 = True")),
                "lightning": Spelling(setup=('torch.set_float32_matmul_precision("high")  # tf32, as Lightning asks for it',))}[target]


TOGGLE = TF32()
