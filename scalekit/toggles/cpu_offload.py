"""CPU offload (FSDP2's policy): sharded weights, gradients and optimizer state live in host memory."""

from __future__ import annotations

from ..checks import check_bool
from ..distributed.runtime import available_with_ranks, distributed_available
from .base import BuildContext, Call, Spelling, Toggle


class CPUOffload(Toggle):
    name = "cpu_offload"
    summary = "FSDP2 CPUOffloadPolicy: shards kept in CPU memory, copied to the device per block; step on the CPU"
    cost = "host-device copies every step and the optimizer step on the CPU: much slower"
    helps_when = "even the sharded model does not fit in device memory (needs fsdp)"
    group = "distributed"
    kind = "memory"
    phase = "wrap"
    needs_process_group = True
    requires = ("fsdp",)
    requires_why = "CPU offload is FSDP2's offload policy (DeepSpeed has its own: deepspeed='zero3-offload')"

    def available(self, hw) -> tuple[bool, str]:
        return available_with_ranks("CPU offload (with FSDP)")

    def available_in_ranks(self, hw) -> tuple[bool, str]:
        return distributed_available()

    def apply(self, ctx: BuildContext, value) -> None:
        # a policy: the fsdp toggle, applied after this one, reads it when it shards (its `requires` keeps fsdp on)
        ctx.offload_to_cpu = True
        where = "already in host memory: on a CPU-only run this exercises the code path, it saves nothing" \
            if ctx.device.type == "cpu" else "in pinned host memory"
        ctx.notes.append(f"cpu_offload: sharded weights, gradients and optimizer state {where}")


    def plan(self, facts, value) -> None:
        facts.offloaded = frozenset(("params", "grads", "state"))
        facts.rank_notes.append("cpu_offload keeps the shards in host memory")

    # Framework spellings: Trainer arguments, accelerate, Lightning
    training_fields = {"fsdp": None, "fsdp_config": None}

    def from_training_arguments(self, fields, notes) -> bool | None:
        # fsdp's options ("full_shard offload") and its config; fsdp, read after this toggle, refuses other kinds
        fsdp, config = fields["fsdp"], fields["fsdp_config"]
        options = fsdp.split() if isinstance(fsdp, str) else fsdp if isinstance(fsdp, list) else []
        if not fsdp or isinstance(fsdp, list) and not all(isinstance(o, str) for o in fsdp):
            return None
        offload = config.get("cpu_offload", False) if isinstance(config, dict) else False
        check_bool("TrainingArguments", "fsdp_config['cpu_offload']", offload)
        return offload or "offload" in options or None

    def spelling(self, target, value, cfg) -> Spelling:
        # an option of fsdp's own spelling, which merges it in (fsdp comes after this toggle in ORDER)
        return {"hf": Spelling(kwargs={"fsdp_config": {"cpu_offload": True}}),
                "accelerate": Spelling(kwargs={"fsdp_plugin": Call("FullyShardedDataParallelPlugin", {"cpu_offload": "True"})}),
                "lightning": Spelling(kwargs={"strategy": Call("FSDPStrategy", {"cpu_offload": "True"})})}[target]


TOGGLE = CPUOffload()
