"""Pipeline parallelism for the built-in GPT with torch.distributed.pipelining.

The GPT's blocks are split into consecutive stages, one per rank: the first stage also embeds the tokens,
the last also holds the final norm, the head and the loss.  Each batch is cut into micro-batches that flow
through the stages; a schedule orders the forwards and backwards (GPipe: all forwards, then all backwards;
1F1B: one forward, one backward, so each stage keeps fewer micro-batches' activations).  Stages wait at the
start and the end of every step: the bubble, (stages - 1) / (micro-batches + stages - 1) of the step with
equal stages (Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM", 2021, section 2.2).

A Hugging Face decoder (scalekit.models.decoder_stages: the order its base_model_pp_plan declares) is split the
same way: its layers into stages, the token embeddings on the first, the final norm and the head on the last.  Its loss is
transformers' causal-LM loss (labels shifted by one, -100 ignored), each micro-batch's summed and divided by
the whole batch's count of targets, so the step's gradient is the whole batch's mean however the ignored
targets fall into micro-batches.

A model that ties its embedding and head weights (the GPT; a Hugging Face model with tie_word_embeddings): with
the first and the last stage on different ranks each keeps a copy, and their gradients are summed between the
two before every update, as Megatron-LM does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError
from .chunked_loss import IGNORE_INDEX
from .decoder_stages import DecoderStage, decoder_parts, decoder_refusal, decoder_targets, summed_loss

# torch.distributed.pipelining and fsdp are imported where a pipeline is built: importing them takes about a
# second, which `import scalekit` (every notebook kernel, every CLI call) should not pay
SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved": "ScheduleInterleaved1F1B"}
LOOPED = ("interleaved",)  # schedules that put several smaller stages on each rank (here: 2)
STAGES_PER_RANK = 2


def bubble(stages: int, micro_batches: int) -> float:
    """The share of a step each stage idles, with equal stages: (p - 1) / (m + p - 1)."""
    return (stages - 1) / (micro_batches + stages - 1)


@dataclass(frozen=True)
class InFlight:
    """The micro-batches whose activations each rank of a pipeline holds (rank 0, the first stage, first), as a
    backward begins: the step's first backward (no gradient exists yet) and the most at any later one (the rank's
    gradients exist).  Counted in micro-batches through all of the rank's blocks: with several stages on a rank
    (interleaved), a micro-batch through one of its v stages is 1/v.  The last stage's head (its logits) counts its
    own: one micro-batch's where the head's backward follows its forward, every micro-batch's under GPipe."""

    micro_batches: int
    first: tuple[float, ...]
    later: tuple[float, ...]  # 0 where a rank has no later backward (one micro-batch)
    head_first: int
    head_later: int


def passes(schedule: str, rank: int, ranks: int, micro_batches: int) -> list[tuple[str, int]]:
    """The forwards ('F') and backwards ('B') one rank of a pipeline runs in a step, in torch's order, each with the
    rank's stage it goes through (0 .. stages per rank - 1): a micro-batch each."""
    m = micro_batches
    if schedule == "gpipe":  # every forward, then every backward
        return [("F", 0)] * m + [("B", 0)] * m
    if schedule == "1f1b":  # ranks - rank forwards first, then one backward before each further forward
        warmup = min(m, ranks - rank)
        return [("F", 0)] * warmup + [("B", 0), ("F", 0)] * (m - warmup) + [("B", 0)] * warmup
    # interleaved 1F1B (torch's ScheduleInterleaved1F1B and _get_1f1b_rank_ops): v stages per rank, taken in rounds
    # of micro-batches; warmup forwards, then a forward and a backward at each step, then the last backwards
    v = STAGES_PER_RANK
    per_round = m // max(1, m // ranks)
    ops = v * m
    warmup = min((v - 1) * per_round + 2 * (ranks - 1 - rank), ops)
    forward = [(step // per_round) % v for step in range(ops)]
    backward = [v - 1 - (step // per_round) % v for step in range(ops)]
    order = [("F", forward[k]) for k in range(warmup)]
    for k in range(ops - warmup):
        order += [("F", forward[warmup + k]), ("B", backward[k])]
    return order + [("B", backward[k]) for k in range(ops - warmup, ops)]


def in_flight(schedule: str, ranks: int, micro_batches: int) -> InFlight:
    """What each rank of a pipeline of `ranks` holds as its backwards begin, under `schedule` (`passes`)."""
    per_rank = STAGES_PER_RANK if schedule in LOOPED else 1
    first, later, head = [], [], []
    for rank in range(ranks):
        held = [0] * per_rank
        moments = []  # (micro-batches through one of the rank's stages held, of them through its last) at each backward
        for kind, stage in passes(schedule, rank, ranks, micro_batches):
            if kind == "B":
                moments.append((sum(held), held[-1]))
            held[stage] += 1 if kind == "F" else -1
        first.append(moments[0][0] / per_rank)
        later.append(max((n for n, _ in moments[1:]), default=0) / per_rank)
        head = [moments[0][1], max((n for _, n in moments[1:]), default=0)]  # the last rank's, its last stage
    return InFlight(micro_batches, tuple(first), tuple(later), *head)


class GPTStage(nn.Module):
    """Blocks [start, stop) of a GPT, with the embeddings on the first stage and the head on the last."""

    def __init__(self, gpt: nn.Module, start: int, stop: int, first: bool, last: bool):
        super().__init__()
        t = gpt.transformer
        self.first, self.last, self.vocab_size = first, last, gpt.config.vocab_size
        self.wte, self.wpe = (t.wte, t.wpe) if first else (None, None)
        self.h = nn.ModuleList(t.h[start:stop])
        self.ln_f, self.lm_head = (t.ln_f, gpt.lm_head) if last else (None, None)

    @property
    def blocks(self) -> nn.ModuleList:
        return self.h

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:  # token ids in
            x = self.wte(x) + self.wpe(torch.arange(x.shape[1], device=x.device))  # (B, T, C)
        for block in self.h:
            x = block(x)
        if not self.last:
            return x  # (B, T, C), sent to the next stage
        logits = self.lm_head(self.ln_f(x))  # (B, T, embedding_rows)
        if logits.size(-1) > self.vocab_size:
            logits[..., self.vocab_size:] = float("-inf")  # padded rows are not tokens (as GPT.forward)
        return logits


def gpt_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1))  # as GPT.forward


@dataclass(frozen=True)
class Layout:
    """How one model splits into stages: its blocks, a stage of them, the weight its embedding and head share (or
    None), how a batch gives the first stage's input and the last stage's targets, and the loss of one micro-batch
    (`summed`: summed over the targets that count, which the pipeline divides by the whole batch's count)."""

    blocks: nn.ModuleList
    stage: Callable[[int, int, bool, bool], nn.Module]  # (start, stop, first, last) -> the stage's module
    tied: tuple[nn.Module, nn.Module] | None  # (embedding, head) where they share one weight
    inputs: Callable[[Any], tuple[torch.Tensor, torch.Tensor]]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    summed: bool
    width: int  # of the activations sent between stages


def layout(model: nn.Module) -> Layout:
    """The built-in GPT's layout or a Hugging Face decoder's (by its base_model_pp_plan); refused (naming what
    stops it) otherwise."""
    blocks = getattr(getattr(model, "transformer", None), "h", None)
    library = getattr(getattr(model, "config", None), "model_type", None)  # a Hugging Face model's family
    if blocks is not None and hasattr(model, "lm_head") and library is None:  # the built-in GPT (or nanoGPT's)
        tied = (model.transformer.wte, model.lm_head) if model.lm_head.weight is model.transformer.wte.weight else None
        return Layout(blocks, lambda *a: GPTStage(model, *a), tied, tuple, gpt_loss, summed=False,
                      width=model.config.n_embd)
    why = decoder_refusal(model)
    if why is not None:
        raise ConfigError(why)
    parts = decoder_parts(model)
    head, embed = parts.head, parts.embedding
    return Layout(parts.layers, lambda *a: DecoderStage(model, *a),
                  (embed, head) if head.weight is embed.weight else None,
                  decoder_targets, summed_loss, summed=True, width=model.config.hidden_size)


def split_stages(model: nn.Module, rank: int, ranks: int, per_rank: int = 1) -> list[nn.Module]:
    """This rank's stages of `model` (`per_rank` of them: rank r holds stages r, r + ranks, ...); refused when the
    stages do not divide the blocks or the model is of no family split here."""
    blocks = layout(model).blocks
    stages = ranks * per_rank
    if len(blocks) % stages:
        raise ConfigError(f"pipeline_parallel: {type(model).__name__}'s {len(blocks)} blocks do not split into {stages} equal "
                          f"stages ({per_rank} per rank on {ranks} ranks): the stages must divide {len(blocks)}")
    per = len(blocks) // stages
    make = layout(model).stage
    return [make(i * per, (i + 1) * per, i == 0, i == stages - 1) for i in range(rank, stages, ranks)]


class Pipeline:
    """Runs one step's forwards and backwards through the schedule; the run calls it as its loss function."""

    def __init__(self, model: nn.Module, mine: list[nn.Module], rank: int, stages: int, schedule: str,
                 micro_batches: int, device, mesh):
        # `rank`: this rank's place in its pipeline; `stages`: the pipeline's ranks; `mine`: this rank's stages
        # (several if looped); `mesh`: (pipeline, data parallel, tensor parallel), the pipeline one column of it
        self.rank, self.stages, self.dp = rank, stages, mesh["dp"].size()
        self.group, self.dp_group = mesh.get_group("pp"), mesh.get_group("dp")
        self.layout, self.micro_batches, self.count = layout(model), micro_batches, 1
        self.module = nn.ModuleList(mine)  # what this rank trains: the run's model
        from torch.distributed import pipelining

        total = stages * len(mine)
        piped = [pipelining.PipelineStage(s, rank + k * stages, total, device, group=self.group) for k, s in enumerate(mine)]
        kind = getattr(pipelining, SCHEDULES[schedule])
        self.schedule = kind(piped if schedule in LOOPED else piped[0], n_microbatches=micro_batches,
                             loss_fn=self.micro_batch_loss)
        # the module holding this rank's copy of the tied embedding/head weight, where the first and last stage are
        # different ranks (its weight read at each step: fsdp, applied later, replaces the parameter)
        ends = self.layout.tied
        self.tied = None if ends is None or stages == 1 or rank not in (0, stages - 1) else ends[rank > 0]
        self.tie_group = tie_group(mesh) if stages > 2 else self.group  # (every rank creates every one)

    def micro_batch_loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # the schedule averages the micro-batches' losses: a summed loss over the batch's count, times their number
        if self.layout.summed:
            return self.layout.loss(logits, targets) * self.micro_batches / self.count
        return self.layout.loss(logits, targets)

    def __call__(self, model, batch) -> torch.Tensor:
        if model is not self.module:  # called on the whole model (counting a step's FLOPs): this rank's share
            return self.local_work(batch)
        from torch.distributed.fsdp import FSDPModule

        if self.dp > 1 and not all(isinstance(m, FSDPModule) for m in self.module):
            raise ConfigError(f"pipeline_parallel: {self.dp} pipelines of {self.stages} stages side by side must "
                              f"average their gradients: turn fsdp on too, or give stages={self.stages * self.dp}")
        x, y = self.layout.inputs(batch)
        if self.layout.summed:  # the targets of every pipeline's rows (fsdp averages the pipelines' gradients)
            count = (y != IGNORE_INDEX).sum()
            dist.all_reduce(count, group=self.dp_group)
            self.count = int(count) / self.dp
        losses: list = []
        if self.rank == 0:
            self.schedule.step(x)
        elif self.rank == self.stages - 1:
            self.schedule.step(target=y, losses=losses)
        else:
            self.schedule.step()
        if self.tied is not None and self.tied.weight.grad is not None:  # embedding (first stage) + head (last)
            grad = self.tied.weight.grad
            dist.all_reduce(grad.to_local() if hasattr(grad, "to_local") else grad, group=self.tie_group)
        # the loss lives on the last stage: every rank of the pipeline reports it
        loss = torch.stack(losses).mean().detach() if losses else torch.zeros((), device=x.device)
        dist.broadcast(loss, group=self.group, group_src=self.stages - 1)
        # the schedule ran backward already: the step's own backward of this leaf computes nothing
        return loss.requires_grad_()


    def local_work(self, batch) -> torch.Tensor:
        """This rank's stages run on the whole batch without the schedule or any send (a stage that is not first
        gets zeros in place of the activations it would receive): the work of this rank's step, for a FLOP count."""
        x, y = self.layout.inputs(batch)
        total = torch.zeros((), device=x.device)
        for stage in self.module:
            width = (*x.shape, self.layout.width)
            out = stage(x if stage.first else torch.zeros(width, device=x.device, requires_grad=True))
            total = total + (self.layout.loss(out, y) if stage.last else out.float().mean())
        return total


def tie_group(mesh):
    """The process group of this rank's first and last stage (the ranks holding the tied weight) in its column: the
    ranks of one (data parallel, tensor parallel) place, one on each stage."""
    ranks = mesh.mesh.reshape(mesh.mesh.shape[0], -1)  # stage -> global rank of each column
    mine = None
    for column in range(ranks.shape[1]):
        group = dist.new_group([int(ranks[0, column]), int(ranks[-1, column])])
        mine = group if dist.get_rank() in (int(ranks[0, column]), int(ranks[-1, column])) else mine
    return mine


def free_other_stages(model: nn.Module, mine: list[nn.Module]) -> None:
    """Move the weights this rank's stages do not use to the meta device: their memory is freed (the model
    keeps their shapes, for its parameter count).  A module whose buffers a stage uses (a rotary embedding's
    inv_freq) stays."""
    kept = {id(t) for stage in mine for t in (*stage.parameters(), *stage.buffers())}
    for module in model.modules():
        tensors = [*module.parameters(), *module.buffers()]
        if not any(True for _ in module.children()) and not any(id(t) in kept for t in tensors):
            module.to("meta")
