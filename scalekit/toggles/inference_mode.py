"""inference_mode: run generation under torch.inference_mode() instead of torch.no_grad()."""

from __future__ import annotations

import torch

from .base import BuildContext, Toggle, Tune


class InferenceMode(Toggle):
    name = "inference_mode"
    summary = "torch.inference_mode() instead of no_grad: no version counters or view tracking on any tensor"
    cost = "tensors made inside cannot be used in autograd or updated in place outside it"
    helps_when = "many small ops per step (a decode loop): the per-op bookkeeping no_grad keeps is a share of the time"
    group = "inference"
    phase = "step"
    loops = ("generate",)
    tuning = (Tune(rank=10, loop="generate"),)
    plan_note = 'inference_mode applies to the evaluation (eval_every), not to a training step'

    def apply(self, ctx: BuildContext, value) -> None:
        # the baseline runs under torch.no_grad(); the decode loop and the evaluation enter this instead
        ctx.inference_context = torch.inference_mode


TOGGLE = InferenceMode()
