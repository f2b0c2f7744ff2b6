"""The multi-process runtime of one run: this rank, the process group, its slice of each batch, metrics across ranks.

A leaf module: it imports no toggle and nothing from `scalekit.launch` (which only starts processes).
The engine calls three things here.  `setup` joins (or creates) the process group when a toggle needs one
(gloo on CPU, NCCL on GPU) and registers its teardown on the run's ExitStack, so that the DDP/FSDP model,
whose release the toggles register later, is freed first (LIFO) — a DDP model still alive when the
group is destroyed can abort the process at exit.  `shard_batches` gives each rank its slice of the
global batch: every rank draws the same global batch from the same seed and keeps rows
[rank*B/W, (rank+1)*B/W), so W ranks together see exactly what one process with batch B sees.
`aggregate` gathers every rank's figures: each token is counted once (the ranks that split the model, a
tensor-parallel group or a pipeline, share their rows: tokens/s is summed over the data-parallel groups, not over
ranks), each rank's peak memory is kept, and the loss is the mean over ranks (equal slices, so the mean of the
whole batch).
"""

from __future__ import annotations

import dataclasses
import gc
import os
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.utils._pytree import tree_flatten, tree_unflatten

from ..checks import micro_batch_rows
from ..errors import ConfigError
from ..measure.memory import LiveTensorBytes
from ..training.results import RunResult

# set by scalekit.launch(timeout_s=...) for its ranks: their collectives give up when the launch would
PG_TIMEOUT_ENV = "SCALEKIT_PG_TIMEOUT_S"
HOW_TO_LAUNCH = ("launch ranks with scalekit.launch(fn, nprocs=2) from a notebook cell, "
                 "`scalekit bench --nproc-per-node 2 ...` or `scalekit launch --nproc-per-node 2 script.py`")


def group_alive() -> bool:
    return dist.is_available() and dist.is_initialized()


def world_size() -> int:
    """Ranks in this run: the live process group's size, else WORLD_SIZE set by the launcher, else 1."""
    if group_alive():
        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    if group_alive():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def available_with_ranks(what: str) -> tuple[bool, str]:
    """A toggle's `available` answer for things that need two or more processes."""
    ok, why = distributed_available()
    if not ok:
        return ok, why
    if world_size() > 1:
        return True, ""
    return False, (f"{what} needs several processes and this one runs alone (world size 1): {HOW_TO_LAUNCH}")


def distributed_available() -> tuple[bool, str]:
    """Whether ranks launched from here could run a distributed toggle: torch.distributed is built in."""
    if not dist.is_available():
        return False, "this torch build has no torch.distributed"
    return True, ""


def rank_device(device: str) -> str:
    """On a GPU machine every launched rank takes the GPU of its local rank (one process per GPU)."""
    local = os.environ.get("LOCAL_RANK")
    if local is not None and device in ("auto", "cuda") and torch.cuda.is_available():
        return f"cuda:{int(local)}"
    return device


@dataclass(frozen=True)
class Ranks:
    rank: int
    world_size: int
    backend: str
    owns_group: bool  # scalekit created the group, so it destroys it at the end of the run


def setup(hw, stack, batch_size: int) -> Ranks:
    """Join the process group a toggle needs, creating it if none is alive (the engine calls this only for
    runs whose toggles need one); its teardown goes on `stack`."""
    owns = False
    if not group_alive():
        backend = "nccl" if hw.device_type == "cuda" else "gloo"
        if "MASTER_ADDR" in os.environ:  # launched: torch.distributed's env:// rendezvous
            dist.init_process_group(backend, device_id=hw.device if hw.device_type == "cuda" else None,
                                    **_launch_timeout())
        else:  # one process (DeepSpeed on one GPU): a group of one needs no network
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        owns = True
        stack.push(_destroy_group)
    ranks = Ranks(dist.get_rank(), dist.get_world_size(), dist.get_backend(), owns)
    micro_batch_rows(batch_size, ranks.world_size)
    return ranks


def any_rank(flag: bool) -> bool:
    """True on every rank if `flag` is True on any (one small all-reduce, at a sync point)."""
    t = torch.tensor([1.0 if flag else 0.0])
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def _launch_timeout() -> dict:
    """The launch's time limit as the process group's timeout, if the launcher set one (else torch's default)."""
    value = os.environ.get(PG_TIMEOUT_ENV)
    if not value:
        return {}
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise ConfigError(f"{PG_TIMEOUT_ENV} must be a positive number of seconds, got {value!r}")
    return {"timeout": timedelta(seconds=seconds)}


def _destroy_group(exc_type=None, exc=None, tb=None) -> bool:
    """The end of a run that created the group: free the model first, then destroy the group."""
    if tb is not None:
        # a failing run's traceback keeps its frames' locals, the model among them: drop them
        traceback.clear_frames(tb)
    gc.collect()  # the toggles dropped their wrappers just before this (LIFO): free them now
    if group_alive():
        dist.destroy_process_group()
    return False  # never swallow the exception


def release_model(ctx) -> None:
    """Drop the build's references to a DDP/FSDP/DeepSpeed model: registered by those toggles on ctx.stack,
    so it runs before the process group is destroyed."""
    ctx.no_sync = ctx.stepper = ctx.blocks = None
    ctx.model = ctx.base_model = ctx.optimizer = None
    gc.collect()


def shard_batches(batches: Iterator, batch_size: int, split=None) -> Iterator:
    """This rank's rows of every global batch (for runs whose toggles split the batch across ranks).  `split()`:
    (this rank's index, ranks) among the ranks that split the batch, or None for every rank; it is read at the
    first batch, so a toggle that shards the model (applied after the batches are built) can still set it."""
    if not group_alive() or dist.get_world_size() == 1:
        return batches
    micro_batch_rows(batch_size, dist.get_world_size())
    return _split_rows(batches, split or (lambda: None))


def _split_rows(batches: Iterator, split) -> Iterator:
    r, w = split() or (dist.get_rank(), dist.get_world_size())
    for batch in batches:
        yield _rows(batch, r, w) if w > 1 else batch


def _rows(batch, r: int, w: int):
    leaves, spec = tree_flatten(batch)
    return tree_unflatten([leaf.chunk(w)[r] if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves], spec)


def adopt(ranks: Ranks, ctx, result: RunResult) -> None:
    """Per-rank accounting: this rank's tokens per step are its data-parallel group's rows of the global batch
    (the ranks that split the model share them), its FLOPs 1/world of the global batch's (a DDP rank does the whole
    model for 1/W of the rows, a tensor-parallel or pipeline rank 1/W of the model for its group's rows)."""
    micro_batch_rows(ctx.config.batch_size, ranks.world_size, ctx.grad_accum_steps)
    result.tokens_per_step //= _data_parallel_ranks(ranks, ctx.data_parallel)
    if result.flops_per_step:
        result.flops_per_step /= ranks.world_size


def _data_parallel_ranks(ranks: Ranks, data_parallel: tuple[int, int] | None) -> int:
    """How many groups of ranks split each batch (None: every rank has its own rows)."""
    return ranks.world_size if data_parallel is None else data_parallel[1]


@dataclass
class DistributedRunResult(RunResult):
    """A run over several ranks: each token counted once (tokens/s summed over the data-parallel groups), the
    largest rank's peak memory, each rank's figures kept."""

    world_size: int = 1
    backend: str = ""
    per_rank: list[dict] = field(default_factory=list)  # rank, tokens_per_s, step_ms, peak_mem_bytes, final_loss, ...

    def summary_row(self):
        row = super().summary_row()
        mems = [r["peak_mem_bytes"] for r in self.per_rank]
        extra = f"{self.world_size} ranks ({self.backend})"
        if all(m is not None for m in mems):
            extra += "; peak MB per rank: " + ", ".join(f"{m / 2**20:.1f}" for m in mems)
        row["note"] = "; ".join(x for x in (extra, row["note"]) if x)
        return row


def aggregate(ranks: Ranks, result: RunResult, data_parallel: tuple[int, int] | None = None) -> DistributedRunResult:
    """Every rank's figures gathered into one result (the same on every rank); `data_parallel`: (index, ranks)
    among the ranks that split each batch, where toggles that split the model set it (None: every rank)."""
    index = ranks.rank if data_parallel is None else data_parallel[0]
    mine = dict(rank=ranks.rank, tokens_per_s=result.tokens_per_s, tokens_per_s_wall=result.tokens_per_s_wall,
                step_ms=result.median_step_ms, peak_mem_bytes=result.peak_mem_bytes, mfu=result.mfu,
                final_loss=result.final_loss, losses=result.losses, status=result.status, data_parallel_index=index,
                tokens_per_step=result.tokens_per_step, peak_tflops=result.peak_tflops,
                step_tokens=[s.tokens for s in result.steps])
    rows: list[dict] = [None] * ranks.world_size  # type: ignore[list-item]
    dist.all_gather_object(rows, mine)
    out = DistributedRunResult(**{f.name: getattr(result, f.name) for f in dataclasses.fields(RunResult)},
                               world_size=ranks.world_size, backend=ranks.backend)
    out.per_rank = [{k: v for k, v in r.items() if k not in ("losses", "step_tokens")} for r in rows]
    _count_tokens_once(out, rows)
    mems = [r["peak_mem_bytes"] for r in rows]
    out.peak_mem_bytes = max(mems) if all(m is not None for m in mems) else None
    if result.flops_per_step:
        out.flops_per_step = result.flops_per_step * ranks.world_size  # each rank did 1/world of them (adopt)
    out.mfu = _job_mfu(out, [r["peak_tflops"] for r in rows])
    # same sync points on every rank: average the losses step by step
    out.losses = [(step, sum(r["losses"][k][1] for r in rows) / len(rows)) for k, (step, _) in enumerate(result.losses)]
    out.final_loss = out.losses[-1][1] if out.losses else None
    out.notes.append(_counting_note(ranks, _data_parallel_ranks(ranks, data_parallel)))
    return out


def _groups(rows: list[dict]) -> list[list[dict]]:
    """The ranks' rows by data-parallel index: each group's ranks (a tensor-parallel group, a pipeline's stages)
    processed the same rows of the batch."""
    by_index: dict[int, list[dict]] = {}
    for row in rows:
        by_index.setdefault(row["data_parallel_index"], []).append(row)
    return [by_index[i] for i in sorted(by_index)]


def _count_tokens_once(out: DistributedRunResult, rows: list[dict]) -> None:
    """Tokens per step, tokens/s and each step's tokens summed over the data-parallel groups, each group's tokens
    counted once: its first rank's tokens, its ranks' mean rate (a group's ranks step together)."""
    groups = _groups(rows)
    out.tokens_per_step = sum(g[0]["tokens_per_step"] for g in groups)
    out.tokens_per_s = _sum(_mean(r["tokens_per_s"] for r in g) for g in groups)
    out.tokens_per_s_wall = _sum(_mean(r["tokens_per_s_wall"] for r in g) for g in groups)
    out.steps = _job_steps(out.steps, [g[0]["step_tokens"] for g in groups])


def _job_steps(steps: list, tokens_by_group: list[list]) -> list:
    """This rank's step records with the whole job's tokens and tokens/s (what a launched run's plots show); kept
    as they are where the groups' steps do not line up (every rank syncs at the same steps, so they do)."""
    if any(len(t) != len(steps) or None in t for t in tokens_by_group):
        return steps
    totals = [sum(step) for step in zip(*tokens_by_group, strict=True)]
    return [dataclasses.replace(s, tokens=n, tokens_per_s=n / (s.step_ms / 1e3)) if s.step_ms else s
            for s, n in zip(steps, totals, strict=True)]


def _job_mfu(out: DistributedRunResult, peaks_tflops: list) -> float | None:
    """The whole job's MFU: the model's FLOPs for the tokens counted, at the job's tokens/s, over every rank's peak
    (the mean of the ranks' own MFUs, each rank doing 1/world of the FLOPs)."""
    if not (out.flops_per_step and out.tokens_per_step and out.tokens_per_s) or None in peaks_tflops:
        return None
    return out.flops_per_step / out.tokens_per_step * out.tokens_per_s / (sum(peaks_tflops) * 1e12)


def _counting_note(ranks: Ranks, groups: int) -> str:
    """How the figures were counted: which ranks split each batch, and that each token counts once."""
    shared = ranks.world_size // groups  # the ranks of one data-parallel group: they share its rows
    rows = f", batch_size/{groups} per rank" if groups > 1 else ", the whole batch on every rank"
    return (f"{ranks.world_size} ranks ({ranks.backend}){rows}: tokens counted once per data-parallel group of "
            f"{shared} rank(s): tokens/s and tokens per step summed over {groups} group(s), FLOPs the model's for "
            f"those tokens, MFU against the peak of all {ranks.world_size} ranks; peak memory of the largest rank, "
            f"loss averaged over ranks")


def _sum(values):
    values = list(values)
    return sum(values) if all(v is not None for v in values) else None


def _mean(values):
    values = list(values)
    return sum(values) / len(values) if values and all(v is not None for v in values) else None


def _local(t):
    return getattr(t, "_local_tensor", t)  # a DTensor (FSDP2) holds this rank's shard in a local tensor


class LocalTensorBytes(LiveTensorBytes):
    """LiveTensorBytes that counts a DTensor by its local shard: the bytes this rank holds."""

    def __init__(self, baseline=(), devices=("cpu",)) -> None:
        super().__init__([_local(t) for t in baseline], devices=devices)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            t = _local(t)
            if isinstance(t, torch.Tensor) and t.device.type in self.devices:
                self._track(t.untyped_storage())
        return out
