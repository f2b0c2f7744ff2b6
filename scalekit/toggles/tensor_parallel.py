"""Tensor parallelism (Megatron-style): each block's linear layers split over ranks that share one batch.

The degree is the 'tp' dimension of the run's one device mesh (parallel.mesh_shape, checked against the ranks
before anything is built): consecutive ranks split each block.  With fsdp on too, the ranks left over form its
data-parallel dimension, which fsdp (after this toggle in ORDER) shards over — torchtitan's order (TP, then FSDP).
Without fsdp, ranks left over would be replicas nothing keeps in step: refused (toggles.replicas_in_step).
With pipeline_parallel too (3-D), the pipeline (before this toggle in ORDER) has split the model into stages
already: this toggle splits the blocks of this rank's stages (BuildContext.blocks), as torchtitan does.

Values: a degree (`tensor_parallel=2`), or `"2,sequence_parallel"` for the norms and the residual stream split
along the sequence too (Megatron's sequence parallelism: SequenceParallel norms, row-wise layers
reduce-scattering, attention and the MLP gathering the sequence at their input); the degree must then divide
the run's seq_len.  Sequence-parallel norms need the model's first block, final norm and head on every rank: not
with a pipeline's stages.
"""

from __future__ import annotations

from ..distributed.runtime import available_with_ranks, distributed_available, release_model
from ..errors import ConfigError
from .base import BuildContext, Spelling
from .counted import CountToggle, as_count

DEGREES = (2, 4, 8)
SEQUENCE = "sequence_parallel"  # the option: "2,sequence_parallel"


class TensorParallel(CountToggle):
    name = "tensor_parallel"
    summary = ("Megatron-style tensor parallelism: attention's and the MLP's widening linears split by columns, "
               "their output linears by rows (torch.distributed.tensor.parallel); the degree is ranks per block")
    cost = "two all-reduces of the activations per block in forward and two in backward: needs fast links (NVLink)"
    helps_when = "one block's weights or activations are too large for a device, or batches too small to split further"
    group = "distributed"
    kind = "memory"
    phase = "wrap"
    choices = DEGREES  # offered in menus; any degree that divides the ranks and the heads is taken
    default = 2
    unit = "ranks per tensor-parallel group (the degree)"
    needs_process_group = True
    excludes = {"ddp": "tensor parallel ranks share one batch: DDP would average their identical gradients (use "
                       "fsdp for a 2-D mesh: fsdp + tensor_parallel)",
                "deepspeed": "DeepSpeed's engine does not take tensor-parallel DTensors here",
                "zero": "zero1/zero2 are not composed with tensor_parallel here (fsdp is: a 2-D mesh)",
                "compile": "not composed here: compile the tensor-parallel blocks in a later version",
                "lora": "adapters are not split by the plan", "dora": "adapters are not split by the plan",
                "quantized_base": "quantized layers are not split by the plan",
                "checkpointing": "not composed here yet (checkpointing wraps the blocks tensor_parallel splits)"}

    def validate(self, value, owner: str = "RunConfig"):
        """A degree (2, True for 2), or 'N,sequence_parallel' for the norms split along the sequence too."""
        degree, comma, option = value.partition(",") if isinstance(value, str) else (value, "", "")
        if not comma:
            return super().validate(value, owner)
        if option.strip() != SEQUENCE or as_count(degree) is None:
            raise ConfigError(f"{owner}.toggles['tensor_parallel'] must be True (= {self.default}), a positive whole "
                              f"number of ranks per block, or 'N,{SEQUENCE}' (norms split along the sequence); "
                              f"got {value!r}")
        return f"{as_count(degree)},{SEQUENCE}"

    def available(self, hw) -> tuple[bool, str]:
        return available_with_ranks("Tensor parallelism")

    def applies_to(self, adapter) -> tuple[bool, str]:
        # a module of your own is checked when it is built (only the built-in GPT has a plan without a config); a
        # Hugging Face model by the plan its config declares
        config = getattr(adapter, "hf_config", None)
        if config is None:
            return True, ""
        from ..models.tensor_parallel import plan_refusal  # torch's tensor-parallel API: imported when asked

        why = plan_refusal(config, adapter.model_class.__name__)
        return (True, "") if why is None else (False, f"does not apply: {why.removeprefix(f'{self.name}: ')}")

    def available_in_ranks(self, hw) -> tuple[bool, str]:
        return distributed_available()

    def apply(self, ctx: BuildContext, value) -> None:
        value, sequence = parse(value)
        seq = ctx.config.seq_len
        if sequence and seq % value:
            raise ConfigError(f"tensor_parallel={value},{SEQUENCE}: the sequence of {seq} tokens does not split "
                              f"over {value} ranks (the degree must divide RunConfig.seq_len={seq})")
        from ..models.tensor_parallel import parallelize  # torch's tensor-parallel API: imported when used

        # every block of the model, or, where the mesh has pipeline stages (split before this toggle, in ORDER), the
        # blocks of this rank's stages: the run's blocks
        staged = ctx.mesh["pp"].size() > 1
        blocks = parallelize(ctx.base_model, ctx.mesh["tp"], value, sequence_parallel=sequence,
                             only=ctx.blocks if staged else None)
        ctx.stack.callback(release_model, ctx)
        split = ", norms split along the sequence" if sequence else ""
        ctx.notes.append(f"tensor_parallel: {blocks} blocks split over {value} ranks{split}; batch split "
                         f"{ctx.data_parallel[1]} ways")

    def mesh_dims(self, value) -> dict[str, int | None]:
        return {"tp": parse(value)[0]}

    def plan(self, facts, value) -> None:
        value, sequence = parse(value)  # (facts.tensor_parallel: the mesh's 'tp' size, set by the planner)
        if sequence:
            facts.rank_notes.append(f"{SEQUENCE}: the norms' activations are 1/{value} per rank, planned whole "
                                    f"(an upper bound)")
        facts.rank_notes.append(f"tensor_parallel: 1/{value} of each block's weights, gradients and optimizer state "
                                f"per rank, the rest replicated; the ranks of a group share their batch")

    # Framework spellings: Trainer arguments, accelerate, Lightning
    spelled_for_transformers_models = True

    def spelling(self, target, value, cfg) -> Spelling:
        value, _ = parse(value)
        if target == "hf":
            return Spelling(model_kwargs={"tp_plan": "'auto'"},
                            notes=(f"tensor_parallel={value}: transformers applies the model's own tp_plan when "
                                   f"launched with torchrun over {value} ranks",))
        return Spelling(missing=f"{'Accelerate' if target == 'accelerate' else 'Lightning'}: tensor parallelism "
                                f"is set up on the model with torch's parallelize_module (not a launcher option)")


def parse(value) -> tuple[int, bool]:
    """(degree, sequence-parallel norms) of a validated value: 2, or '2,sequence_parallel'."""
    degree, _, option = str(value).partition(",")
    return int(degree), option == SEQUENCE


TOGGLE = TensorParallel()
