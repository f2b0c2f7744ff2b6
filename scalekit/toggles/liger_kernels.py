"""liger_kernels: Liger-Kernel's fused Triton kernels on a Hugging Face Llama-family model: RMSNorm, RoPE, SwiGLU, and
the fused linear cross-entropy that computes the loss chunk by chunk without materialising the logits."""

from __future__ import annotations

import importlib.util
import sys

from ..errors import ToggleUnavailable
from ..optional import quiet_import
from .base import BuildContext, Spelling, Toggle, Tune

# transformers' model_type -> Liger's patching function for it (the Llama family: RMSNorm, RoPE, SwiGLU MLPs)
PATCHES = {"llama": "apply_liger_kernel_to_llama", "mistral": "apply_liger_kernel_to_mistral",
           "qwen2": "apply_liger_kernel_to_qwen2"}
KERNELS = dict(rope=True, rms_norm=True, swiglu=True, cross_entropy=False, fused_linear_cross_entropy=True)


class LigerKernels(Toggle):
    name = "liger_kernels"
    summary = "Liger-Kernel's fused RMSNorm, RoPE, SwiGLU and linear cross-entropy on a Hugging Face Llama-family model"
    cost = "Triton kernels compiled on first use; numerically close to, not identical with, the unfused ops"
    helps_when = "large vocabularies and long sequences on a GPU (the logits are the largest activation)"
    group = "memory"
    kind = "both"
    phase = "wrap"
    plan_note = ("liger_kernels runs Triton kernels on the GPU only (its fused linear cross-entropy never holds the "
                 "logits): only a trace on a GPU with liger-kernel can tell; the plan counts the run without it")
    tuning = (Tune(True, rank=40, label="Liger kernels"),)

    def available(self, hw) -> tuple[bool, str]:
        if hw.device_type != "cuda":
            return False, ("Liger-Kernel's kernels are Triton kernels for NVIDIA GPUs; this run is on the CPU, where "
                           "they cannot run")
        if importlib.util.find_spec("liger_kernel") is None:
            return False, "liger_kernels needs liger-kernel, which is not installed (pip install liger-kernel)"
        return True, ""

    def applies_to(self, adapter) -> tuple[bool, str]:
        if adapter.architecture in PATCHES:
            return True, ""
        return False, (f"does not apply to {adapter.family}: Liger's kernels are patched into Hugging Face "
                       f"{', '.join(PATCHES)} models only")

    def apply(self, ctx: BuildContext, value) -> None:
        ok, why = self.available(ctx.hw)
        if not ok:
            raise ToggleUnavailable(why)
        adapter = ctx.model_adapter
        ok, why = self.applies_to(adapter) if adapter is not None else (False, "does not apply to the built-in GPT: "
                                                                        "it has no Llama-family modules to patch")
        if not ok:
            raise ToggleUnavailable(f"liger_kernels {why}")
        patch(ctx.base_model, adapter.architecture, ctx.stack)
        ctx.notes.append("liger_kernels: fused RMSNorm, RoPE, SwiGLU and linear cross-entropy (Liger-Kernel)")

    # Framework spellings: Trainer arguments, accelerate, Lightning
    spelled_for_transformers_models = True

    def spelling(self, target, value, cfg) -> Spelling:
        if target == "hf":
            return Spelling(kwargs={"use_liger_kernel": True}, gpu_only=True)
        return Spelling(imports=("from liger_kernel.transformers import _apply_liger_kernel_to_instance",),
                        model=("_apply_liger_kernel_to_instance(model=model)  # Liger-Kernel, GPU only",), gpu_only=True)


def patch(model, architecture: str, stack) -> None:
    """Liger's kernels into `model` (its modules and forward); Liger also rewrites transformers' modeling module
    for the whole process: what it replaced there is put back when the run ends (`stack`)."""
    modeling = sys.modules[type(model).__module__]
    saved_module, saved_forward = dict(vars(modeling)), type(model).forward

    def restore() -> None:
        for key, value in saved_module.items():
            if getattr(modeling, key, None) is not value:
                setattr(modeling, key, value)
        type(model).forward = saved_forward

    stack.callback(restore)
    liger = quiet_import("liger_kernel.transformers", "cuda")
    getattr(liger, PATCHES[architecture])(model=model, **KERNELS)


TOGGLE = LigerKernels()
