"""Pipeline parallelism: the model's blocks split into stages, one per rank, micro-batches flowing through them.

The built-in GPT and Hugging Face decoders laid out as Llama is (Llama, Mistral, Qwen2, Qwen3: embeddings →
layers → norm → head) are split (scalekit.models.pipeline, scalekit.models.decoder_stages); any other model is
refused up front, naming the families that are.  Schedules: 'gpipe', '1f1b', 'interleaved' (two stages per
rank), each with '/m' micro-batches ('1f1b/8').  Every schedule trains as one process with the whole batch does
(tests/test_distributed_parallel.py for the GPT, tests/test_distributed_pipeline_hf.py for a Llama).

',stages=S' runs pipelines of S stages side by side ('1f1b/8,stages=2' on 4 ranks: a (pipeline 2, data 2) mesh,
checked here against the ranks); fsdp, applied after this toggle, shards each stage over the pipelines and
averages their gradients.  pipeline × tensor parallel (3-D) is refused by name.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import init_device_mesh

from ..distributed import available_with_ranks, distributed_available, release_model
from ..errors import ConfigError
from ..models.decoder_stages import FAMILIES
from ..models.pipeline import (
    LOOPED,
    SCHEDULES,
    STAGES_PER_RANK,
    Pipeline,
    bubble,
    free_other_stages,
    split_stages,
)
from .base import BuildContext, Spelling, Toggle

THREE_D = ("pipeline × tensor parallel (3-D) is not composed here: tensor_parallel builds its (data, tensor) mesh "
           "over every rank before the pipeline would take one dimension of it (pipeline × fsdp is composed: "
           "pipeline_parallel='1f1b,stages=2' with fsdp)")
MICRO_BATCHES = 4  # micro-batches per step unless the value says ("1f1b/8")


def parse(value) -> tuple[str, int, int | None]:
    """(schedule, micro-batches, stages or None: one per rank) of a validated value: '1f1b/8,stages=2'."""
    head, _, option = str(value).partition(",")
    schedule, _, count = head.partition("/")
    return schedule, int(count) if count else MICRO_BATCHES, int(option.partition("=")[2]) if option else None


def pp_mesh(device_type: str, world: int, stages: int):
    """The ranks as (pipeline, data parallel): the ranks of one column run the stages of one pipeline, each row
    (the same stage) splits the batch, and fsdp (after it in ORDER) shards over the rows; refused up front, naming
    the numbers, when the stages do not divide the ranks."""
    if stages < 1 or world % stages:
        raise ConfigError(f"pipeline_parallel stages={stages} does not fit {world} ranks: the ranks form a (pipeline, "
                          f"data parallel) mesh of shape ({stages}, {world}/{stages}), so {stages} must divide {world}")
    return init_device_mesh(device_type, (stages, world // stages), mesh_dim_names=("pp", "dp"))


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
    excludes = {name: "not composed with pipeline_parallel here" for name in
                ("ddp", "fsdp", "zero", "tensor_parallel", "deepspeed", "compile", "checkpointing", "lora", "dora",
                 "quantized_base")}
    excludes = {k: v for k, v in excludes.items() if k != "fsdp"}  # 2-D: a (pipeline, data parallel) mesh
    excludes = {**excludes, "tensor_parallel": THREE_D,
                "grad_accum": "the pipeline cuts each batch into micro-batches itself: use "
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
        # a module of your own is checked when it is built: a nanoGPT-style GPT (transformer.h, lm_head) is split
        if adapter.architecture is None or adapter.architecture in FAMILIES:
            return True, ""
        return False, (f"splits the built-in GPT and Hugging Face decoders of the families {', '.join(FAMILIES)} into "
                       f"stages; {adapter.family} is none of them")

    def available_in_ranks(self, hw) -> tuple[bool, str]:
        return distributed_available()

    def apply(self, ctx: BuildContext, value: str) -> None:
        schedule, micro, stages = parse(value)
        mesh = pp_mesh(ctx.device.type, ctx.world_size, stages or ctx.world_size)
        ranks, dp = mesh.shape  # `ranks`: the stages of one pipeline; `dp`: the pipelines splitting the batch
        rows = ctx.config.batch_size // dp
        if rows % micro:
            raise ConfigError(f"pipeline_parallel={value!r}: the {rows} rows of a pipeline's share of the batch "
                              f"(batch_size {ctx.config.batch_size} over {dp}) do not split into {micro} micro-batches")
        me, column = mesh.get_local_rank("pp"), mesh.get_local_rank("dp")
        per_rank = STAGES_PER_RANK if schedule in LOOPED else 1
        mine = split_stages(ctx.base_model, me, ranks, per_rank)  # refused here if the blocks do not split
        pipeline = Pipeline(ctx.base_model, mine, me, ranks, schedule, micro, ctx.device, mesh)
        free_other_stages(ctx.base_model, mine)
        ctx.model, ctx.loss_fn = pipeline.module, pipeline  # what this rank trains: its stages
        ctx.blocks = nn.ModuleList([b for stage in mine for b in stage.blocks])  # fsdp shards these
        # every stage of a pipeline sees its rows of the batch (the first their tokens, the last their targets)
        ctx.data_parallel, ctx.data_mesh = (column, dp), mesh["dp"]
        ctx.stack.callback(release_model, ctx)
        # interleaving v stages per rank divides the bubble by v (Narayanan et al., 2021, section 2.2.2)
        idle = bubble(ranks, micro) / per_rank
        per_stage = len(pipeline.layout.blocks) // (ranks * per_rank)
        ctx.notes.append(f"pipeline_parallel: {per_stage} blocks per stage, {per_rank} stage(s) on each of "
                         f"{ranks} ranks, {schedule}, {micro} micro-batches: bubble {idle:.0%} of the step")

    def plan(self, facts, value) -> None:
        stages = parse(value)[2] or facts.world_size
        if facts.world_size % stages:
            raise ConfigError(f"pipeline_parallel stages={stages} does not fit {facts.world_size} ranks: {stages} must "
                              f"divide {facts.world_size}")
        facts.pipeline_stages = stages
        facts.rank_notes.append(f"pipeline_parallel: 1/{stages} of the blocks per rank (the embeddings on "
                                f"the first stage, the head on the last), activations of the micro-batches in flight")

    def spelling(self, target, value, cfg) -> Spelling:
        return Spelling(missing="pipeline parallelism is set up with torch.distributed.pipelining around the model "
                                "(no Trainer, Accelerate or Lightning option carries it)")


TOGGLE = PipelineParallel()
