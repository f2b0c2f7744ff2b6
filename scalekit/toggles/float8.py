"""float8: torchao's float8 training: the blocks' linears compute their three matmuls in float8 (e4m3 inputs and
weights, e5m2 gradients) with dynamic tensor-wise scales, on GPUs with float8 tensor cores."""

from __future__ import annotations

import importlib.util

from ..errors import ToggleUnavailable
from ..models.blocks import block_linears
from ..optional import quiet_import
from .base import BuildContext, Spelling, Toggle, Tune

MIN_CAPABILITY = (8, 9)  # Ada (sm_89), Hopper (sm_90), Blackwell: the GPUs with float8 tensor cores
MULTIPLE = 16  # float8 matmuls (torch._scaled_mm) need both dimensions of a weight to be multiples of 16


class Float8(Toggle):
    name = "float8"
    summary = "float8 training (torchao convert_to_float8_training): the blocks' matmuls in float8 with dynamic scales"
    cost = "casting and scaling around every matmul: pays only when the matmuls are large (torchtitan: 8B models and up)"
    helps_when = "large matmuls on a GPU with float8 tensor cores (H100, H200, L40S, RTX 40xx; capability ≥ 8.9)"
    group = "precision"
    kind = "both"
    phase = "wrap"
    excludes = {"qat": "float8 and qat both replace the blocks' linear layers (Float8Linear, FakeQuantizedLinear)"}
    plan_note = ("float8 keeps float8 copies of the matmul inputs for backward (1 byte a value): only a trace on the "
                 "GPU can tell; the plan counts the run without it")
    tuning = (Tune(True, rank=35, label="float8 matmuls"),)

    def available(self, hw) -> tuple[bool, str]:
        if hw.device_type != "cuda":
            return False, ("float8 training needs a CUDA GPU with float8 tensor cores (compute capability ≥ 8.9); on "
                           "the CPU only its numerics can be emulated, which says nothing about its speed")
        if hw.capability is None or tuple(hw.capability) < MIN_CAPABILITY:
            return False, (f"{hw.device_name} (compute capability {hw.capability}) has no float8 tensor cores: "
                           f"float8 training needs capability ≥ 8.9 (Ada, Hopper or newer)")
        if importlib.util.find_spec("torchao") is None:
            return False, "float8 needs torchao, which is not installed (pip install scalekit[quant], or pip install torchao)"
        return True, ""

    def apply(self, ctx: BuildContext, value) -> None:
        ok, why = self.available(ctx.hw)
        if not ok:
            raise ToggleUnavailable(why)
        n = to_float8(ctx.base_model, device_type=ctx.device.type)
        if not n:
            raise ToggleUnavailable(f"float8 found no linear layer it can take in the blocks of "
                                    f"{type(ctx.base_model).__name__} (nn.Linear, both sizes multiples of {MULTIPLE})")
        if ctx.compute_dtype is None:
            ctx.notes.append("float8 without bf16: the matmuls are float8, the rest of the model fp32 (torchtitan "
                             "pairs float8 with bf16)")
        ctx.notes.append(f"float8: {n} linear layers compute in float8")

    # Framework spellings: Trainer arguments, accelerate, Lightning
    def spelling(self, target, value, cfg) -> Spelling:
        return Spelling(imports=("from torchao.float8 import convert_to_float8_training",),
                        model=("convert_to_float8_training(model)  # torchao: every nn.Linear with sizes divisible by 16",),
                        gpu_only=True)


def float8_linears(model) -> set[str]:
    """Qualified names of the blocks' nn.Linear layers float8 can take (both dimensions multiples of 16)."""
    modules = dict(model.named_modules())
    return {n for n in block_linears(model)
            if modules[n].in_features % MULTIPLE == 0 and modules[n].out_features % MULTIPLE == 0}


def to_float8(model, emulate: bool = False, device_type: str = "cuda") -> int:
    """Swap the blocks' linears for torchao's Float8Linear in place (emulate: float8 numerics in fp32 matmuls, for
    a CPU); returns how many."""
    names = float8_linears(model)
    f8 = quiet_import("torchao.float8", device_type)
    f8.convert_to_float8_training(model, config=f8.Float8LinearConfig(emulate=emulate),
                                  module_filter_fn=lambda module, fqn: fqn in names)
    return len(names)


TOGGLE = Float8()
