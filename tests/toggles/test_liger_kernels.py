"""liger_kernels: GPU only (the reason said on the CPU, and the package to install); Llama-family Hugging Face models
only (others refused naming their family); Liger's process-wide patches undone when the run ends."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import sys
import types

import pytest

from scalekit import RunConfig, ToggleUnavailable
from scalekit.toggles import TOGGLES
from scalekit.toggles.liger_kernels import patch
from tests.helpers import CPU

pytest.importorskip("transformers")
LIGER = TOGGLES["liger_kernels"]


def test_unavailable_on_the_cpu_and_names_the_package_on_a_gpu_without_it():
    ok, why = LIGER.available(CPU)
    assert not ok and "NVIDIA" in why and "CPU" in why and "\n" not in why
    if importlib.util.find_spec("liger_kernel") is None:
        gpu = dataclasses.replace(CPU, device_type="cuda", device_name="NVIDIA H100", capability=(9, 0))
        ok, why = LIGER.available(gpu)
        assert not ok and "pip install liger-kernel" in why


def test_applies_to_llama_and_refuses_other_families_naming_them():
    from scalekit.hf import causal_lm

    assert RunConfig(model=causal_lm("llama", preset="tiny"), toggles=["liger_kernels"]).toggles
    with pytest.raises(ToggleUnavailable, match="liger_kernels.*GPT2LMHeadModel") as refused:
        RunConfig(model=causal_lm("gpt2", preset="tiny"), toggles=["liger_kernels"])
    assert "\n" not in str(refused.value)


def test_the_process_wide_patch_is_undone_when_the_run_ends(monkeypatch):
    from transformers.models.llama import modeling_llama

    from scalekit.hf import causal_lm

    model = causal_lm("llama", preset="tiny").build()
    norm, forward = modeling_llama.LlamaRMSNorm, type(model).forward

    def fake_apply(model, **kernels):  # what Liger does: module-level classes and the model's forward replaced
        assert kernels["fused_linear_cross_entropy"] and kernels["rms_norm"] and kernels["swiglu"] and kernels["rope"]
        modeling_llama.LlamaRMSNorm = type("LigerRMSNorm", (), {})
        type(model).forward = lambda self, *a, **k: None

    fake = types.ModuleType("liger_kernel.transformers")
    fake.apply_liger_kernel_to_llama = fake_apply
    monkeypatch.setitem(sys.modules, "liger_kernel", types.ModuleType("liger_kernel"))
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", fake)
    with contextlib.ExitStack() as stack:
        patch(model, "llama", stack)
        assert modeling_llama.LlamaRMSNorm is not norm and type(model).forward is not forward
    assert modeling_llama.LlamaRMSNorm is norm and type(model).forward is forward
