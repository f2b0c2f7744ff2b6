"""DeepSpeed ZeRO stages 1-3, optionally offloading to the CPU (the optional `scalekit[deepspeed]` extra)."""

from __future__ import annotations

import importlib.util

import torch

from ..checks import dict_or_none
from ..distributed.runtime import available_with_ranks, distributed_available, release_model
from .base import BuildContext, Spelling, Toggle

MODES = ("zero2", "zero1", "zero3", "zero1-offload", "zero2-offload", "zero3-offload")


class DeepSpeed(Toggle):
    name = "deepspeed"
    summary = "DeepSpeed ZeRO: stage 1 shards optimizer state, 2 also gradients, 3 also weights; -offload to CPU"
    cost = "communication like FSDP's for stage 3; offload moves the optimizer step (and stage-3 weights) to the CPU"
    helps_when = "the model's training state does not fit on the GPUs; offload when even sharding is not enough"
    group = "distributed"
    kind = "memory"
    phase = "step"  # wraps the model and the optimizer scalekit built, after accumulation is known
    choices = MODES
    needs_process_group = True
    averages_gradients = True
    excludes = {
        "ddp": "DeepSpeed does its own data parallelism: pick one",
        "fsdp": "both shard the training state: pick one",
        "cpu_offload": "DeepSpeed has its own offload: use deepspeed='zero2-offload' or 'zero3-offload'",
        "fp16": "DeepSpeed scales fp16 losses itself: use bf16, or DeepSpeed's own fp16 config",
    }

    def available(self, hw) -> tuple[bool, str]:
        ok, why = self.available_in_ranks(hw)
        return available_with_ranks("DeepSpeed") if ok else (ok, why)

    def available_in_ranks(self, hw) -> tuple[bool, str]:
        # on a CPU, DeepSpeed's CPU accelerator runs ZeRO 1-3 over gloo (tests/distributed/test_distributed_deepspeed.py: the
        # built-in GPT, an HF Llama and a plain module train as one process does, to 1e-5); its speed there says
        # nothing of a GPU's
        if importlib.util.find_spec("deepspeed") is None:
            return False, "DeepSpeed is not installed: pip install 'scalekit[deepspeed]' (it builds its ops on first use)"
        return distributed_available()

    def apply(self, ctx: BuildContext, value: str) -> None:
        import deepspeed

        micro = ctx.config.batch_size // ctx.world_size // ctx.grad_accum_steps
        config = ds_config(value, micro, ctx.world_size, bf16=ctx.wrapper_param_dtype == torch.bfloat16)
        # the client optimizer stays ctx.optimizer: ZeRO rewrites its param groups into its partitions
        engine, _, _, _ = deepspeed.initialize(model=ctx.model, optimizer=ctx.optimizer, config=config)
        ctx.model = engine
        ctx.stepper = DeepSpeedStep(engine)
        ctx.stack.callback(release_model, ctx)
        ctx.stack.callback(engine.destroy)  # LIFO: DeepSpeed's own teardown, then the references
        ctx.notes.append(f"deepspeed: ZeRO stage {value[4]}{' with CPU offload' if 'offload' in value else ''}")


    def plan(self, facts, value: str) -> None:
        stage = int(value[4])
        facts.sharded = frozenset(("state", *(("grads",) if stage >= 2 else ()), *(("params",) if stage == 3 else ())))
        facts.gathers_blocks = stage == 3
        what = {1: "optimizer state", 2: "optimizer state and gradients", 3: "optimizer state, gradients and weights"}
        note = f"deepspeed ZeRO-{stage}: {what[stage]} split {facts.world_size} ways"
        if value.endswith("-offload"):
            facts.offloaded = frozenset(("state", *(("params",) if stage == 3 else ())))
            note += "; the optimizer state" + (" and weights" if stage == 3 else "") + " in host memory"
        facts.rank_notes.append(note)

    # Framework spellings: Trainer arguments, accelerate, Lightning
    training_fields = {"deepspeed": None, "fsdp": None}

    def from_training_arguments(self, fields, notes) -> str | None:
        config = fields["deepspeed"]
        if isinstance(config, str):
            notes.append(f"deepspeed={config!r} not mapped: a JSON file is not read (give a dict config)")
            return None
        config = dict_or_none("TrainingArguments", "deepspeed", config)
        if not config:
            return None
        if fields["fsdp"]:
            notes.append("deepspeed not mapped: fsdp is set too, and a run shards with one of them")
            return None
        zero = config.get("zero_optimization")
        if not isinstance(zero, dict) or type(zero.get("stage")) is not int or zero["stage"] not in (1, 2, 3):
            notes.append("deepspeed not mapped: give a dict config with zero_optimization.stage 1, 2 or 3")
            return None
        return f"zero{zero['stage']}" + ("-offload" if "offload_optimizer" in zero or "offload_param" in zero else "")

    def spelling(self, target, mode: str, cfg) -> Spelling:
        stage, offload = int(mode[4]), mode.endswith("-offload")
        if target == "hf":  # "auto": the Trainer fills them in from its own arguments
            return Spelling(kwargs={"deepspeed": {"zero_optimization": ds_config(mode, 1, 1, False)["zero_optimization"],
                                                  "bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"},
                                                  "train_micro_batch_size_per_gpu": "auto",
                                                  "gradient_accumulation_steps": "auto"}})
        if target == "accelerate":
            where = (', offload_optimizer_device="cpu"' if offload else "") + \
                (', offload_param_device="cpu"' if offload and stage == 3 else "")
            return Spelling(kwargs={"deepspeed_plugin": f"DeepSpeedPlugin(zero_stage={stage}{where})"},
                            imports=("from accelerate.utils import DeepSpeedPlugin",))
        return Spelling(kwargs={"strategy": repr(f"deepspeed_stage_{stage}" + ("_offload" if offload else ""))})


def ds_config(mode: str, micro_batch: int, ranks: int, bf16: bool) -> dict:
    """DeepSpeed's config for a ZeRO mode; accumulation is scalekit's (see DeepSpeedStep), so DeepSpeed's is 1."""
    stage = int(mode[4])
    zero: dict = {"stage": stage}
    if mode.endswith("-offload"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        if stage == 3:
            zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    # gradient_clipping 0: DeepSpeed clips gradients to a global norm of 1.0 unless told otherwise (its
    # GRADIENT_CLIPPING_DEFAULT), which no other run in scalekit does; with it the ranks trained apart from one
    # process (losses 8e-4 apart by the third step, at stage 0 too: a rescaled gradient moves Adam's update)
    return {"train_micro_batch_size_per_gpu": micro_batch, "gradient_accumulation_steps": 1,
            "train_batch_size": micro_batch * ranks, "zero_optimization": zero, "bf16": {"enabled": bf16},
            "gradient_clipping": 0.0,
            "zero_allow_untested_optimizer": True, "zero_force_ds_cpu_optimizer": False,
            "steps_per_print": 2**31 - 1}


class DeepSpeedStep:
    """The run's stepper when DeepSpeed owns the step: backward and step go through its engine.

    The training step calls backward once per micro-batch (the loss already divided by their number) and
    step once; the last micro-batch is DeepSpeed's accumulation boundary, so it reduces gradients there.
    """

    def __init__(self, engine):
        self.engine = engine

    def backward(self, loss, boundary: bool) -> None:
        self.engine.set_gradient_accumulation_boundary(boundary)
        self.engine.backward(loss)

    def step(self) -> None:
        self.engine.step()  # the update and clearing the gradients, both DeepSpeed's


TOGGLE = DeepSpeed()
