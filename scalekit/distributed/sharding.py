"""What the distributed toggles share: FSDP2's options read from the build context, ZeRO-1's optimizer, meshes.

fsdp (ZeRO-3), zero (ZeRO-1, ZeRO-2), tensor_parallel and pipeline_parallel all build on torch.distributed; the
helpers they have in common live here (a toggle never imports another toggle), so each rule is written once.

The device mesh is one of them: each parallel toggle declares its dimension (Toggle.mesh_dims: 'pp' pipeline
stages, 'tp' tensor-parallel degree), `mesh_shape` checks them together against the ranks, and the run builds one
(pp, dp, tp) mesh before its toggles act (training.build), which they read as BuildContext.mesh: the pipeline takes
'pp', tensor parallelism 'tp', fsdp shards over 'dp'.  The order they apply in is ORDER's, torchtitan's: the
pipeline split into stages first, then tensor parallelism on each stage's blocks, then fsdp.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ..errors import ConfigError


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


# -- the device mesh: every parallel toggle's dimension of one mesh, built once ------------------------------------
MESH_DIMS = ("pp", "dp", "tp")  # pipeline stages, data-parallel ranks, tensor-parallel degree: the mesh's axes
DIM_WORDS = {"pp": "pipeline_parallel stages", "dp": "data-parallel ranks", "tp": "tensor_parallel degree"}


def mesh_shape(dims: dict[str, int | None], world: int) -> tuple[int, int, int]:
    """(pipeline stages, data-parallel ranks, tensor-parallel degree) of `world` ranks, from the dimensions the
    parallel toggles declare (Toggle.mesh_dims: a size, or None for every rank the other dimensions leave); the
    data-parallel dimension takes what is left.  Refused, naming every number, when the sizes do not divide the ranks."""
    fixed = {d: n for d, n in dims.items() if n is not None}
    product = math.prod(fixed.values())
    if product < 1 or world % product:
        sizes = " × ".join(f"{DIM_WORDS[d]} {n}" for d, n in sorted(fixed.items(), key=lambda x: MESH_DIMS.index(x[0])))
        total = f" = {product}" if len(fixed) > 1 else ""
        rest = next((d for d, n in dims.items() if n is None), "dp")  # the dimension that takes the ranks left
        shape = ", ".join(str(fixed[d]) if d in fixed else f"{world}/{product}" if d == rest else "1" for d in MESH_DIMS)
        raise ConfigError(f"{sizes}{total} does not divide {world} ranks: the ranks form one (pipeline, data parallel, "
                          f"tensor parallel) mesh of shape ({shape}), so {product} must divide {world}")
    filled = {d: world // product if n is None else n for d, n in dims.items()}
    pp, tp = filled.get("pp", 1), filled.get("tp", 1)
    return pp, world // (pp * tp), tp


def device_mesh(device_type: str, shape: tuple[int, int, int]):
    """The run's one (pp, dp, tp) DeviceMesh: consecutive ranks split each block (tp), then the pipelines side by side
    split the batch (dp), the outermost dimension holding the stages (pp), as torchtitan lays out its 3-D mesh."""
    from torch.distributed.device_mesh import init_device_mesh  # imported when used

    return init_device_mesh(device_type, shape, mesh_dim_names=MESH_DIMS)


def batch_split(mesh) -> tuple[int, int]:
    """(this rank's index, ranks) among those splitting each batch: its place on the data-parallel dimension (the
    ranks of a pipeline, and of a tensor-parallel group, share their rows)."""
    return mesh.get_local_rank("dp"), mesh["dp"].size()
