"""Pipeline parallelism for the built-in GPT with torch.distributed.pipelining.

The GPT's blocks are split into consecutive stages, one per rank: the first stage also embeds the tokens,
the last also holds the final norm, the head and the loss.  Each batch is cut into micro-batches that flow
through the stages; a schedule orders the forwards and backwards (GPipe: all forwards, then all backwards;
1F1B: one forward, one backward, so each stage keeps fewer micro-batches' activations).  Stages wait at the
start and the end of every step: the bubble, (stages - 1) / (micro-batches + stages - 1) of the step with
equal stages (Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM", 2021, section 2.2).

The GPT ties its embedding and head weights: with the first and the last stage on different ranks each keeps
a copy, and their gradients are summed between the two before every update, as Megatron-LM does.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

from ..errors import ConfigError

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved": ScheduleInterleaved1F1B}
LOOPED = ("interleaved",)  # schedules that put several smaller stages on each rank (here: 2)
STAGES_PER_RANK = 2


def bubble(stages: int, micro_batches: int) -> float:
    """The share of a step each stage idles, with equal stages: (p - 1) / (m + p - 1)."""
    return (stages - 1) / (micro_batches + stages - 1)


class GPTStage(nn.Module):
    """Blocks [start, stop) of a GPT, with the embeddings on the first stage and the head on the last."""

    def __init__(self, gpt: nn.Module, start: int, stop: int, first: bool, last: bool):
        super().__init__()
        t = gpt.transformer
        self.first, self.last, self.vocab_size = first, last, gpt.config.vocab_size
        self.wte, self.wpe = (t.wte, t.wpe) if first else (None, None)
        self.h = nn.ModuleList(t.h[start:stop])
        self.ln_f, self.lm_head = (t.ln_f, gpt.lm_head) if last else (None, None)

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


def split_stages(gpt: nn.Module, rank: int, ranks: int, per_rank: int = 1) -> list[GPTStage]:
    """This rank's stages of `gpt` (`per_rank` of them: rank r holds stages r, r + ranks, ...); refused when the
    stages do not divide the blocks or the model is no GPT."""
    blocks = getattr(getattr(gpt, "transformer", None), "h", None)
    if blocks is None or not hasattr(gpt, "lm_head"):
        raise ConfigError(f"pipeline_parallel: scalekit splits the built-in GPT's blocks into stages; "
                          f"{type(gpt).__name__} is not split here")
    stages = ranks * per_rank
    if len(blocks) % stages:
        raise ConfigError(f"pipeline_parallel: the model's {len(blocks)} blocks do not split into {stages} equal "
                          f"stages ({per_rank} per rank on {ranks} ranks): the stages must divide {len(blocks)}")
    per = len(blocks) // stages
    return [GPTStage(gpt, i * per, (i + 1) * per, i == 0, i == stages - 1)
            for i in range(rank, stages, ranks)]


class Pipeline:
    """Runs one step's forwards and backwards through the schedule; the run calls it as its loss function."""

    def __init__(self, gpt: nn.Module, mine: list[GPTStage], rank: int, stages: int, schedule: str,
                 micro_batches: int, device):
        self.rank, self.stages = rank, stages  # `stages`: ranks; `mine`: this rank's stages (several if looped)
        total = stages * len(mine)
        piped = [PipelineStage(s, rank + k * stages, total, device) for k, s in enumerate(mine)]
        kind = SCHEDULES[schedule]
        self.schedule = kind(piped if schedule in LOOPED else piped[0], n_microbatches=micro_batches, loss_fn=gpt_loss)
        tied = gpt.lm_head.weight is gpt.transformer.wte.weight
        # this rank's copy of the tied embedding/head weight, where the first and last stage are different ranks
        self.tied = gpt.lm_head.weight if tied and stages > 1 and rank in (0, stages - 1) else None
        self.tie_group = dist.new_group([0, stages - 1]) if stages > 2 else None  # (every rank creates it)

    def __call__(self, model, batch) -> torch.Tensor:
        x, y = batch
        losses: list = []
        if self.rank == 0:
            self.schedule.step(x)
        elif self.rank == self.stages - 1:
            self.schedule.step(target=y, losses=losses)
        else:
            self.schedule.step()
        if self.tied is not None and self.tied.grad is not None:  # embedding (first stage) + head (last stage)
            dist.all_reduce(self.tied.grad, group=self.tie_group)
        # the loss lives on the last stage: every rank reports it
        loss = torch.stack(losses).mean().detach() if losses else torch.zeros((), device=x.device)
        dist.broadcast(loss, src=self.stages - 1)
        # the schedule ran backward already: the step's own backward of this leaf computes nothing
        return loss.requires_grad_()


def free_other_stages(gpt: nn.Module, mine: list[GPTStage]) -> None:
    """Move the weights this rank's stages do not use to the meta device: their memory is freed (the model
    keeps their shapes, for its parameter count)."""
    kept = {id(p) for stage in mine for p in stage.parameters()}
    for module in gpt.modules():
        if not any(True for _ in module.children()) and not any(id(p) in kept for p in module.parameters()):
            module.to("meta")
