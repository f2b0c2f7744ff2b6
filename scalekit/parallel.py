"""What the distributed toggles share: FSDP2's options read from the build context, ZeRO-1's optimizer, meshes.

fsdp (ZeRO-3), zero (ZeRO-1, ZeRO-2) and tensor_parallel all build on torch.distributed; the helpers they
have in common live here (a toggle never imports another toggle), so each rule is written once.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def shard_kwargs(ctx, mesh, reshard_after_forward: bool = True) -> dict:
    """fully_shard's options for this run: the mesh, mixed precision and CPU offload
    (read from the context), and whether each block's weights are freed after its forward (ZeRO-3) or kept
    gathered until its backward (ZeRO-2)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy  # imported when used

    kwargs: dict = {"mesh": mesh, "reshard_after_forward": reshard_after_forward}
    if ctx.wrapper_param_dtype is not None:
        # compute in the precision toggle's dtype, reduce gradients in fp32: the sharded fp32 weights stay
        # the master copy
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=ctx.wrapper_param_dtype, reduce_dtype=torch.float32)
    if ctx.offload_to_cpu:
        # pinned host memory speeds the copies to a GPU; a CPU-only run has no device to pin for
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=ctx.device.type == "cuda")
    return kwargs


def zero_redundancy(params: list, make: Callable[[list], torch.optim.Optimizer]) -> torch.optim.Optimizer:
    """ZeRO-1: the optimizer `make(params)` would build, each rank stepping only its share of the parameters
    (so keeping only their state) and broadcasting the updated weights to the others after the step."""
    # imported here: torch.distributed.optim scripts its functional optimizers on import (slow, and deprecation
    # warnings) and only a ZeRO-1 run needs it
    from torch.distributed.optim import ZeroRedundancyOptimizer

    zero = ZeroRedundancyOptimizer(params, optimizer_class=lambda local, **_: make(local))
    # this rank's optimizer state is its local optimizer's: memory accounting reads `state`
    zero.state = zero.optim.state
    return zero
