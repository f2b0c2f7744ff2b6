"""DeepSpeed's ZeRO 1-3 (the `deepspeed` toggle, real DeepSpeed on its CPU accelerator) over 2 gloo ranks train as
one process does: the losses step by step and the full parameters after the steps, against 1 process with the
whole batch (fp32, the built-in GPT's tiny preset).

DeepSpeed clips gradients to a global norm of 1.0 unless its config says otherwise; scalekit's config turns that
off, as no other run clips.  Clipped, the ranks drifted from one process (losses 8e-4 apart by the third step, at
every stage, stage 0 included): `test_clipping_is_what_moved_deepspeed_away` keeps the cause in view."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.distributed as dist

import scalekit
from scalekit import distributed
from scalekit.engine import build
from scalekit.launch import launch
from scalekit.toggles.deepspeed import ds_config
from tests.helpers import losses_over_ranks, tiny
from tests.test_launch import no_process_left_behind  # noqa: F401 - the same deadline and cleanup here

CPU = scalekit.detect("cpu")
STEPS = 4
BATCH = 8
STAGES = ("zero1", "zero2", "zero3")


def train(toggles: dict) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Losses (averaged over ranks) of STEPS steps of the tiny GPT, and its full parameters after them."""
    cfg = tiny(batch_size=BATCH, toggles=toggles).resolve(CPU)
    with contextlib.ExitStack() as stack:
        group = distributed.setup(CPU, stack, cfg.batch_size) if toggles else None
        ctx = build(cfg, CPU, stack)
        losses = losses_over_ranks(ctx, STEPS, group)
        with gathered(ctx.base_model, toggles):
            params = {name: p.detach().clone() for name, p in ctx.base_model.named_parameters()}
        del ctx
    return losses, params


def gathered(model, toggles):
    """ZeRO-3 holds each weight in shards: gathered whole for reading, as DeepSpeed's own API does it."""
    if toggles.get("deepspeed") != "zero3":
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(list(model.parameters()))


def _every_stage():
    dist.init_process_group("gloo")
    out = {stage: train({"deepspeed": stage}) for stage in STAGES}
    dist.destroy_process_group()
    return out


@pytest.fixture(scope="module")
def two_ranks():
    return launch(_every_stage, nprocs=2)


@pytest.fixture(scope="module")
def one_process():
    return train({})


@pytest.mark.parametrize("stage", STAGES)
def test_each_zero_stage_trains_like_one_process(stage, one_process, two_ranks):
    ref_losses, ref_params = one_process
    for rank_out in two_ranks:
        losses, params = rank_out[stage]
        assert losses == pytest.approx(ref_losses, rel=1e-5)
        assert params.keys() == ref_params.keys()
        for name in params:  # Adam's slack where a gradient is near zero, as the other data-parallel tests allow
            torch.testing.assert_close(params[name], ref_params[name], atol=5e-5, rtol=1e-4,
                                       msg=lambda m, name=name: f"{stage} {name}: {m}")


def test_clipping_is_what_moved_deepspeed_away():
    for stage in STAGES:
        assert ds_config(stage, 4, 2, False)["gradient_clipping"] == 0.0  # DeepSpeed's own default is 1.0
    from deepspeed.runtime.constants import GRADIENT_CLIPPING_DEFAULT

    assert GRADIENT_CLIPPING_DEFAULT != 0.0, "DeepSpeed no longer clips by default: the comment in ds_config is stale"
