"""Activation offload: what forward saves for backward is moved to host memory, and brought back for backward."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .base import BuildContext, Toggle, Tune


class ActivationOffload(Toggle):
    name = "activation_offload"
    summary = "saved activations moved to pinned host memory during forward and copied back for backward"
    cost = "two copies of every saved activation over PCIe per step, not overlapped with compute; pinned host memory"
    helps_when = "activations do not fit in GPU memory and recomputing them (checkpointing) costs more than the copies"
    group = "memory"
    kind = "memory"
    phase = "wrap"
    tuning = (Tune(rank=132, label="activation offload (to fit)", memory_only=True),)
    plan_note = ("activation_offload keeps saved activations in host memory on a GPU; the plan counts them on the "
                 "device, an upper bound there")

    def available(self, hw) -> tuple[bool, str]:
        if hw.device_type == "cuda":
            return True, ""
        return False, ("activation_offload moves saved activations from GPU memory to host memory; this run is on the "
                       "CPU, where they are in host memory already: there is no device memory to save")

    def apply(self, ctx: BuildContext, value) -> None:
        ctx.loss_fn = offloaded(ctx.loss_fn, pin_memory=True)  # the step's forward runs inside it
        ctx.notes.append("saved activations offloaded to pinned host memory (torch.autograd.graph.save_on_cpu)")


def offloaded(loss_fn: Callable, pin_memory: bool = True) -> Callable:
    """`loss_fn(model, batch)` with every tensor its forward saves for backward copied to host memory (pinned, so
    the copies back to the GPU are direct), freed on the device, and copied back when backward needs it."""
    def run(model, batch):
        with torch.autograd.graph.save_on_cpu(pin_memory=pin_memory):
            return loss_fn(model, batch)

    return run


TOGGLE = ActivationOffload()
