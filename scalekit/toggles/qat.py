"""qat: quantization-aware training with torchao: the blocks' linears train fake-quantized (int4 weights, optionally
int8 activations) so that the model converted to real int4 afterwards loses less than post-training quantization."""

from __future__ import annotations

import importlib.util

from ..errors import ToggleUnavailable, toggle_why
from ..models import qat as qat_mod
from ..models.quantization import no_linear_why, own_model_to_inspect
from .base import BuildContext, Spelling, Toggle


class QAT(Toggle):
    name = "qat"
    summary = "quantization-aware training (torchao QATConfig): the blocks' linears train fake-quantized to int4"
    cost = "each forward rounds every weight (and activation) it quantizes: slower steps, one weight-sized copy per linear"
    helps_when = "the model will be quantized to int4 after training: QAT recovers part of the loss PTQ costs"
    group = "finetune"
    kind = "runtime"
    phase = "wrap"
    choices = tuple(qat_mod.MODES)
    plan_note = ("qat fake-quantizes the linears (a weight-sized copy each, kept for backward): only a trace can "
                 "tell its memory, and the analytic plan of the built-in GPT defers to it")

    def available(self, hw) -> tuple[bool, str]:
        if importlib.util.find_spec("torchao") is None:
            return False, "qat needs torchao, which is not installed (pip install scalekit[quant], or pip install torchao)"
        return True, ""

    def applies_to(self, adapter) -> tuple[bool, str]:
        # a model of your own with no linear layer to fake-quantize would train as without qat: refused before the run
        model = own_model_to_inspect(adapter)
        if model is not None and not qat_mod.target_names(model):
            return False, self.no_target_why(model)
        return True, ""

    def apply(self, ctx: BuildContext, value: str) -> None:
        ok, why = self.available(ctx.hw)
        if not ok:
            raise ToggleUnavailable(why)
        n = qat_mod.prepare(ctx.base_model, value, ctx.device.type)
        if not n:
            raise ToggleUnavailable(toggle_why("qat", self.no_target_why(ctx.base_model)))
        ctx.notes.append(f"qat={value}: {n} linear layers train fake-quantized; after training, "
                         f"scalekit.models.qat.convert(model, {value!r}) makes them int4")

    def no_target_why(self, model) -> str:
        return f"{no_linear_why(model)}; qat takes those with a multiple of {qat_mod.GROUP} input features"

    def plan(self, facts, value) -> None:
        facts.analytic = False  # torchao's fake quantization is traced

    def traced(self, value) -> bool:
        return True

    # Framework spellings: Trainer arguments, accelerate, Lightning
    def spelling(self, target, value, cfg) -> Spelling:
        return Spelling(imports=("from scalekit.models import qat",),
                        model=(f"qat.prepare(model, {value!r})  # after training: qat.convert(model, {value!r})",))


TOGGLE = QAT()
