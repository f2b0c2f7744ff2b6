"""FSDP with LoRA adapters over 2 gloo ranks trains like one process with the whole batch.

In tests/distributed/: the suite runs these first, before anything imports bitsandbytes
(peft imports it), after which launching forked ranks is refused.  The one-process reference is trained
inside the ranks too, after their process group is gone, so the parent process never imports peft.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.distributed as dist

import scalekit
from scalekit import RunConfig
from scalekit.distributed import runtime as distributed
from scalekit.launch import launch
from scalekit.toggles import needs_process_group
from scalekit.training.build import build
from tests.forking import no_process_left_behind  # noqa: F401 - the same deadline and cleanup here
from tests.helpers import losses_over_ranks

CPU = scalekit.detect("cpu")
STEPS = 3


def _train(toggles):
    cfg = RunConfig(preset="shakespeare-char", init="pretrained", data="new-plays", seq_len=64, batch_size=8,
                    lr=1e-3, toggles=toggles, device="cpu").resolve(CPU)
    with contextlib.ExitStack() as stack:
        group = distributed.setup(CPU, stack, cfg.batch_size) if needs_process_group(cfg.toggles) else None
        ctx = build(cfg, CPU, stack)
        frozen = {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
                  for n, p in ctx.base_model.named_parameters() if not p.requires_grad}
        losses = losses_over_ranks(ctx, STEPS, group)
        params = {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
                  for n, p in ctx.base_model.named_parameters()}
        sharded = sum(hasattr(p, "full_tensor") for p in ctx.base_model.parameters())
        del ctx
    adapters = {n: p for n, p in params.items() if "lora_" in n}
    unchanged = all(torch.equal(params[n], p) for n, p in frozen.items())
    return losses, adapters, unchanged, sharded


def _fsdp_then_alone():
    dist.init_process_group("gloo")
    spread = _train({"lora": 8, "fsdp": True})
    dist.destroy_process_group()
    return spread, _train({"lora": 8})


@pytest.fixture(scope="module")
def both():
    return launch(_fsdp_then_alone, nprocs=2)


def test_fsdp_with_lora_matches_one_process_on_the_whole_batch(both):
    (losses, adapters, unchanged, sharded), (ref_losses, ref_adapters, ref_unchanged, _) = both[0]
    assert sharded > 0  # the parameters really were DTensors, sharded over the ranks
    assert losses == pytest.approx(ref_losses, abs=1e-5)
    assert adapters.keys() == ref_adapters.keys() and len(adapters) == 32
    for name, p in ref_adapters.items():
        torch.testing.assert_close(adapters[name], p, atol=1e-5, rtol=1e-4)
    assert unchanged and ref_unchanged  # the frozen base did not move, sharded or not
    assert both[0][0][0] == both[1][0][0]  # every rank saw the same averaged losses


def test_fsdp_with_a_4bit_base_is_refused_with_the_reason():
    with pytest.raises(scalekit.ConfigError, match="bnb_4bit_quant_storage"):
        RunConfig(preset="shakespeare-char", toggles={"fsdp": True, "lora": 8, "quantized_base": "nf4"})
