"""Per-rank figures for a run spread over ranks (ddp, fsdp, cpu_offload, deepspeed).

The planner first plans one rank's step as a single process: the rank's slice of the batch, no
distributed toggle.  Then it moves the parts each strategy moves:
- DDP keeps everything on every rank, plus its gradient buckets: a flat copy of every gradient
  (`gradient_as_bucket_view=False`, DDP's default).
- FSDP2 keeps 1/W of the weights, gradients and optimizer state, and gathers one block's full weights at
  a time (two while the next is prefetched), reduce-scattering one block's gradients; CPU offload moves
  the shards to host memory.
- DeepSpeed ZeRO-1 shards the optimizer state, ZeRO-2 also the gradients, ZeRO-3 also the weights
  (gathered per block like FSDP); `-offload` moves the optimizer state (and ZeRO-3's weights) to the host.
Collective buffers beyond these (NCCL's own, the allocator's rounding of shards) are not predicted.
"""

from __future__ import annotations

import dataclasses

from .estimate import FP32, Estimate

SPREAD = ("ddp", "fsdp", "cpu_offload", "deepspeed")  # toggles that spread a run over ranks


@dataclasses.dataclass(frozen=True)
class Parts:
    params: int
    grads: int
    state: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.state


def per_rank(single: Estimate, toggles: dict, world: int, param_bytes_per_value: int, on_gpu: bool) -> Estimate:
    """`single` (one rank's step planned as one process) with each part where the toggles put it.

    param_bytes_per_value: the dtype the sharding wrapper gathers weights in (2 under bf16, else 4).
    """
    block_bytes = single.largest_block_bytes
    full = Parts(single.params_bytes, single.grads_bytes, single.optimizer_state_bytes)
    activations = single.peak_bytes - full.total  # activations and temporaries of the rank's slice
    gathered = block_bytes * param_bytes_per_value // FP32
    if "ddp" in toggles:
        device, host, extra, note = full, Parts(0, 0, 0), full.grads, \
            "ddp: every rank keeps the whole model, its gradients and optimizer state, plus gradient buckets " \
            "(a flat copy of every gradient)"
    elif "fsdp" in toggles:
        device, host, extra, note = _fsdp(full, world, "cpu_offload" in toggles and on_gpu)
        extra = 2 * gathered + block_bytes  # two gathered blocks (one prefetched), one block's gradients
    else:
        device, host, extra, note = _zero(full, world, toggles["deepspeed"])
        if toggles["deepspeed"].startswith("zero3"):
            extra = 2 * gathered + block_bytes
    if not on_gpu and host.total:
        device, host = Parts(*(a + b for a, b in zip(dataclasses.astuple(device), dataclasses.astuple(host),
                                                     strict=True))), Parts(0, 0, 0)
        note += "; on a CPU-only run the host is the device, so offloading saves nothing here"
    peak = device.total + activations + extra
    return dataclasses.replace(single, params_bytes=device.params, grads_bytes=device.grads,
                               optimizer_state_bytes=device.state, activations_bytes=peak - device.total,
                               peak_bytes=peak, host_bytes=host.total, world_size=world,
                               notes=[*single.notes, f"per rank of {world}: {note}"])


def _fsdp(full: Parts, world: int, offload: bool):
    shard = Parts(*(-(-x // world) for x in dataclasses.astuple(full)))
    note = (f"fsdp: 1/{world} of the weights, gradients and optimizer state per rank, one block's full weights "
            f"gathered at a time (two while the next is prefetched) and one block's gradients reduce-scattered")
    if offload:
        return Parts(0, 0, 0), shard, 0, note + "; cpu_offload keeps the shards in host memory"
    return shard, Parts(0, 0, 0), 0, note


def _zero(full: Parts, world: int, mode: str):
    stage = int(mode[4])
    sharded = Parts(-(-full.params // world) if stage >= 3 else full.params,
                    -(-full.grads // world) if stage >= 2 else full.grads, -(-full.state // world))
    note = f"deepspeed ZeRO-{stage}: " + {1: "optimizer state", 2: "optimizer state and gradients",
                                         3: "optimizer state, gradients and weights"}[stage] + f" split {world} ways"
    if mode.endswith("-offload"):
        host = Parts(sharded.params if stage == 3 else 0, 0, sharded.state)
        device = Parts(sharded.params - host.params, sharded.grads, 0)
        return device, host, 0, note + "; the optimizer state" + (" and weights" if stage == 3 else "") + \
            " in host memory"
    return sharded, Parts(0, 0, 0), 0, note
