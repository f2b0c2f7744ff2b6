"""Pipeline parallelism: the model's blocks split into stages, one per rank, micro-batches flowing through them.

The built-in GPT and the Hugging Face decoders whose config declares the order of their parts
(base_model_pp_plan: embeddings → layers → norm → head; Llama, Mistral, Qwen2, Qwen3, Phi-3, Gemma 2 and GPT-NeoX
checked) are split (scalekit.models.pipeline, scalekit.models.decoder_stages); any other model is refused up
front, saying what stops it (GPT-2, OPT and Falcon: transformers declares no such order for them).  Schedules: 'gpipe', '1f1b', 'interleaved' (two stages per
rank), each with '/m' micro-batches ('1f1b/8').  Every schedule trains as one process with the whole batch does
(tests/distributed/test_distributed_parallel.py for the GPT, tests/distributed/test_distributed_pipeline_hf.py for a Llama,
tests/distributed/test_distributed_parallel_families.py for the other families).

',stages=S' runs pipelines of S stages side by side ('1f1b/8,stages=2' on 4 ranks: a (pipeline 2, data 2) mesh);
fsdp, applied after this toggle, shards each stage over the pipelines and averages their gradients.  With
tensor_parallel too (3-D), each stage's blocks are split over the tensor-parallel ranks: '1f1b,stages=2' with
tensor_parallel=2 on 4 ranks is a (pipeline 2, data 1, tensor 2) mesh, and with fsdp on 8 ranks (2, 2, 2).  The
stages are the 'pp' dimension of the run's one device mesh (parallel.mesh_shape, checked against the ranks before
anything is built); without ',stages=S' a pipeline takes every rank the other dimensions leave.  The order is
torchtitan's: this toggle splits the model into stages first (ORDER), tensor_parallel then splits the blocks of
this rank's stages, fsdp last shards them.
"""

from __future__ import annotations

from torch import nn

from ..distributed.runtime import available_with_ranks, distributed_available, release_model
from ..errors import ConfigError
from ..models.decoder_stages import config_refusal
from ..models.pipeline import (
    LOOPED,
    SCHEDULES,
    STAGES_PER_RANK,
    Pipeline,
    bubble,
    free_other_stages,
    in_flight,
    split_stages,
)
from .base import BuildContext, Spelling, Toggle

MICRO_BATCHES = 4  # micro-batches per step unless the value says ("1f1b/8")


class PipelineParallel(Toggle):
    name = "pipeline_parallel"
    summary = ("pipeline parallelism (torch.distributed.pipelining): the blocks split into one stage per rank, "
               "each batch cut into micro-batches; '1f1b', 'gpipe' or 'interleaved' (2 stages per rank), '/m' for m "
               "micro-batches ('1f1b/8'), ',stages=S' for pipelines of S stages side by side (with fsdp)")
    cost = "the bubble: each stage idles (stages-1)/(micro-batches+stages-1) of a step; activations sent between ranks"
    helps_when = "the model's layers do not fit one device and the links between devices are slow (across nodes)"
    group = "distributed"
    kind = "memory"
    phase = "wrap"
    choices = ("1f1b", "gpipe", "interleaved")
    needs_process_group = True
    # fsdp and tensor_parallel compose with it on one (pipeline, data parallel, tensor parallel) mesh
    excludes = {name: "not composed with pipeline_parallel here" for name in
                ("ddp", "zero", "deepspeed", "compile", "checkpointing", "lora", "dora", "quantized_base")}
    excludes = {**excludes, "grad_accum": "the pipeline cuts each batch into micro-batches itself: use "
                                          "pipeline_parallel='1f1b/8' for 8 micro-batches"}

    def validate(self, value, owner: str = "RunConfig"):
        head, comma, option = value.partition(",") if isinstance(value, str) else ("", "", "")
        schedule, _, count = head.partition("/")
        key, _, stages = option.partition("=")
        if value is True:
            return self.choices[0]
        if schedule in SCHEDULES and (not count or count.isdigit() and int(count) >= 1) and (
                not comma or key.strip() == "stages" and stages.strip().isdigit() and int(stages) >= 1):
            return f"{head},stages={int(stages)}" if comma else value
        raise ConfigError(f"{owner}.toggles['pipeline_parallel'] must be True, 'gpipe', '1f1b' or 'interleaved', "
                          f"optionally with '/micro-batches' ('1f1b/8') and ',stages=S' (S stages over the ranks, "
                          f"the rest splitting the batch: '1f1b/8,stages=2'); got {value!r}")

    def available(self, hw) -> tuple[bool, str]:
        return available_with_ranks("Pipeline parallelism")

    def applies_to(self, adapter) -> tuple[bool, str]:
        # a module of your own is checked when it is built: a nanoGPT-style GPT (transformer.h, lm_head) is split;
        # a Hugging Face model by what its config declares (the order of its parts, its kinds of layers)
        config = getattr(adapter, "hf_config", None)
        why = config_refusal(config, adapter.model_class.__name__) if config is not None else None
        if why is None:
            return True, ""
        return False, f"does not apply: {why.removeprefix(f'{self.name}: ')}"

    def available_in_ranks(self, hw) -> tuple[bool, str]:
        return distributed_available()

    def apply(self, ctx: BuildContext, value: str) -> None:
        schedule, micro, _ = parse(value)
        mesh = ctx.mesh  # (pipeline, data parallel, tensor parallel): its 'pp' dimension is this toggle's
        ranks, dp = mesh["pp"].size(), mesh["dp"].size()  # the stages of one pipeline; the pipelines splitting the batch
        rows = ctx.config.batch_size // dp
        if rows % micro:
            raise ConfigError(f"pipeline_parallel={value!r}: the {rows} rows of a pipeline's share of the batch "
                              f"(batch_size {ctx.config.batch_size} over {dp}) do not split into {micro} micro-batches")
        me = mesh.get_local_rank("pp")
        per_rank = STAGES_PER_RANK if schedule in LOOPED else 1
        mine = split_stages(ctx.base_model, me, ranks, per_rank)  # refused here if the blocks do not split
        pipeline = Pipeline(ctx.base_model, mine, me, ranks, schedule, micro, ctx.device, mesh)
        free_other_stages(ctx.base_model, mine)
        ctx.model, ctx.loss_fn = pipeline.module, pipeline  # what this rank trains: its stages
        # tensor_parallel (next in ORDER) splits these, fsdp shards them; every stage of a pipeline sees its rows of
        # the batch (the first their tokens, the last their targets): ctx.data_parallel, from the mesh
        ctx.blocks = nn.ModuleList([b for stage in mine for b in stage.blocks])
        ctx.stack.callback(release_model, ctx)
        # interleaving v stages per rank divides the bubble by v (Narayanan et al., 2021, section 2.2.2)
        idle = bubble(ranks, micro) / per_rank
        per_stage = len(pipeline.layout.blocks) // (ranks * per_rank)
        ctx.notes.append(f"pipeline_parallel: {per_stage} blocks per stage, {per_rank} stage(s) on each of "
                         f"{ranks} ranks, {schedule}, {micro} micro-batches: bubble {idle:.0%} of the step")

    def mesh_dims(self, value) -> dict[str, int | None]:
        return {"pp": parse(value)[2]}  # None: one stage on each rank the other dimensions leave

    def plan(self, facts, value) -> None:
        stages = facts.pipeline_stages  # the mesh's 'pp' size, set by the planner (parallel.mesh_shape)
        schedule, micro, _ = parse(value)
        facts.pipeline_in_flight = held = in_flight(schedule, stages, micro)
        counts = ", ".join(f"{n:g}" for n in held.first)
        facts.rank_notes.append(f"pipeline_parallel: 1/{stages} of the blocks per rank (the embeddings on the first "
                                f"stage, the head on the last); {schedule} keeps {counts} of the {micro} micro-batches' "
                                f"activations on the stages, first to last, as their first backward begins")

    # Framework spellings: Trainer arguments, accelerate, Lightning
    def spelling(self, target, value, cfg) -> Spelling:
        return Spelling(missing="pipeline parallelism is set up with torch.distributed.pipelining around the model "
                                "(no Trainer, Accelerate or Lightning option carries it)")


def parse(value) -> tuple[str, int, int | None]:
    """(schedule, micro-batches, stages or None: one per rank) of a validated value: '1f1b/8,stages=2'."""
    head, _, option = str(value).partition(",")
    schedule, _, count = head.partition("/")
    return schedule, int(count) if count else MICRO_BATCHES, int(option.partition("=")[2]) if option else None


TOGGLE = PipelineParallel()
