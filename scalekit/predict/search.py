"""`scalekit.plan_for(model, gpus="64xH100-SXM", batch_size=..., seq_len=...)`: every parallel plan for the GPUs
given, predicted with `predict`, those that do not fit dropped with the reason, the rest ranked by predicted
tokens/s per GPU, and why the winner wins and what each runner-up lacks, read off the predictions' step split.

The plans: data parallel (DDP), FSDP, ZeRO-1, ZeRO-2 over the data-parallel ranks; tensor-parallel degrees that
divide the attention heads and the GPUs of a node; pipeline degrees that divide the layers, each with GPipe and
1F1B; activation checkpointing off, selective and full; and every micro-batch size (a power of two, or the whole
share) that splits a data-parallel rank's share of the global batch (pipeline micro-batches, or gradient
accumulation without a pipeline).  The global batch and the sequence length are the same for every plan, so
ranking by tokens/s per GPU is ranking by step time, and the step time's terms (matmul, memory traffic, per-op
overhead, each collective's exposed time, the bubble) say where one plan gains on another.

Context parallel degrees 1, 2, 4 and 8 within a node are searched, priced as ring attention; tensor_parallel's
sequence_parallel option is priced as plain tensor parallel and expert parallelism is not searched (no
mixture-of-experts shapes), and the search says so in its notes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..errors import ConfigError
from .explain import explain
from .inputs import as_number, check_sizes, toggles_of, whole_degree
from .parts import gpus as parse_gpus
from .shapes import shape_of
from .step import GIB, Prediction, predict

SHARDINGS = ("ddp", "fsdp", "zero1", "zero2")
SCHEDULES = ("gpipe", "1f1b")
CHECKPOINTING = (None, "selective", 1)
# the toggles a plan sets; given in `toggles=`, each fixes its dimension of the search instead
SEARCHED = ("ddp", "fsdp", "zero", "tensor_parallel", "pipeline_parallel", "checkpointing", "grad_accum",
            "context_parallel")


@dataclass(frozen=True)
class Plan:
    """One way to spread the step: sharding over `dp` data-parallel ranks, tensor and pipeline degrees, the
    schedule and its micro-batches (gradient accumulation's steps without a pipeline), checkpointing, and the rows
    of one micro-batch on one data-parallel rank."""

    sharding: str  # none, ddp, fsdp, zero1, zero2
    dp: int
    tp: int = 1
    pp: int = 1
    schedule: str | None = None
    micro_batches: int = 1
    checkpointing: object = None  # None, 'selective', 1 (every block)
    micro_batch_size: int = 1
    cp: int = 1  # context parallel: each rank holds 1/cp of every sequence

    def toggles(self, base: dict | None = None) -> dict:
        """The RunConfig toggles of this plan, on top of `base` (bf16, sdpa, ...)."""
        out = dict(base or {})
        if self.sharding in ("ddp", "fsdp"):
            out[self.sharding] = True
        elif self.sharding in ("zero1", "zero2"):
            out["zero"] = self.sharding
        if self.tp > 1:
            out["tensor_parallel"] = self.tp
        if self.cp > 1:
            out["context_parallel"] = self.cp
        if self.pp > 1:
            out["pipeline_parallel"] = f"{self.schedule}/{self.micro_batches},stages={self.pp}"
        elif self.micro_batches > 1:
            out["grad_accum"] = self.micro_batches
        if self.checkpointing is not None:
            out["checkpointing"] = self.checkpointing
        return out

    @property
    def dimensions(self) -> int:
        """How many parallel dimensions beyond data parallel the plan uses (tensor, context, pipeline)."""
        return (self.tp > 1) + (self.cp > 1) + (self.pp > 1)

    @property
    def label(self) -> str:
        parts = [f"{self.sharding if self.sharding != 'none' else 'no sharding'} ×{self.dp}"]
        if self.tp > 1:
            parts.append(f"tp {self.tp}")
        if self.cp > 1:
            parts.append(f"cp {self.cp}")
        if self.pp > 1:
            parts.append(f"pp {self.pp} {self.schedule} m{self.micro_batches}")
        elif self.micro_batches > 1:
            parts.append(f"accum {self.micro_batches}")
        ckpt = {None: "no ckpt", "selective": "selective ckpt", 1: "full ckpt"}.get(self.checkpointing,
                                                                                   f"ckpt {self.checkpointing}")
        parts += [ckpt, f"mbs {self.micro_batch_size}"]
        return ", ".join(parts)

    def __str__(self) -> str:
        return self.label


@dataclass
class Ranked:
    """A plan that fits, its prediction, and the sentence that says what it lacks against the winner."""

    plan: Plan
    prediction: Prediction
    lacks: str = ""

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.prediction.tokens_per_s_per_gpu


@dataclass
class PlanSearch:
    """The plans that fit, best first (`plans`), those refused with the reason (`refused`: (plan or degrees,
    sentence)), why the winner wins and what the runners-up lack (`why`), and notes on what was not searched."""

    model: str
    gpus: str
    batch_size: int
    seq_len: int
    budget_bytes_per_gpu: float
    plans: list[Ranked]
    refused: list[tuple[object, str]]
    why: list[str]
    notes: list[str] = field(default_factory=list)
    considered: int = 0  # plans predicted (fitting or not)
    seconds: float = 0.0
    measured: list[dict] = field(default_factory=list)  # run_top: each run plan's predicted and measured figures

    @property
    def best(self) -> Ranked | None:
        return self.plans[0] if self.plans else None

    @property
    def frame(self):
        """One row per plan predicted: the ranked ones first (rank 1 is the winner), then those that do not fit."""
        import pandas as pd

        rows = []
        for i, r in enumerate(self.plans, 1):
            rows.append(_row(r.plan, r.prediction, rank=i, fits=True, note=r.lacks))
        for plan, reason in self.refused:
            if isinstance(plan, Plan) and isinstance(reason, _Unfit):
                rows.append(_row(plan, reason.prediction, rank=None, fits=False, note=str(reason)))
        return pd.DataFrame(rows)

    def table(self, top: int = 15) -> str:
        head = (f"{self.model} on {self.gpus}: global batch {self.batch_size} × seq {self.seq_len}, budget "
                f"{self.budget_bytes_per_gpu / GIB:.1f} GiB per GPU: {self.considered} plans predicted in "
                f"{self.seconds:.2f} s, {len(self.plans)} fit, {len(self.refused)} refused")
        lines = [head]
        if self.plans:
            cols = f"{'#':>3}  {'plan':<58} {'tok/s/GPU':>10} {'MFU':>6} {'step ms':>9} {'compute':>9} " \
                   f"{'exp.comm':>9} {'bubble':>8} {'GiB':>6}"
            lines.append(cols)
            for i, r in enumerate(self.plans[:top], 1):
                p = r.prediction
                mfu = f"{100 * p.mfu:.1f}%" if p.mfu is not None else "n/a"
                lines.append(f"{i:>3}  {r.plan.label:<58} {p.tokens_per_s_per_gpu:>10,.0f} {mfu:>6} "
                             f"{p.step_s * 1e3:>9.1f} {p.compute_s * 1e3:>9.1f} {p.exposed_comm_s * 1e3:>9.1f} "
                             f"{p.bubble_s * 1e3:>8.1f} {p.memory['peak'] / GIB:>6.1f}")
            if len(self.plans) > top:
                lines.append(f"     ... {len(self.plans) - top} more (PlanSearch.plans, PlanSearch.frame)")
        lines += ["why:"] + [f"- {w}" for w in self.why]
        degrees = [(p, r) for p, r in self.refused if not isinstance(p, Plan)]
        if degrees:
            lines += ["skipped:"] + [f"- {p}: {r}" for p, r in degrees]
        unfit = [(p, r) for p, r in self.refused if isinstance(r, _Unfit)]
        if unfit:
            lines.append(f"{len(unfit)} plans do not fit; the closest: {_leanest(unfit)}")
        other = [(p, r) for p, r in self.refused if isinstance(p, Plan) and not isinstance(r, _Unfit)]
        if other:
            lines.append(f"{len(other)} plans refused by predict; the first: {other[0][0]}: {other[0][1]}")
        for m in self.measured:
            lines.append(f"measured: {m['plan']}: predicted {m['predicted_ms']:.1f} ms/step, measured "
                         f"{m['measured_ms']:.1f} ms ({m['ratio']:.2f}×)")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


class _Unfit(str):
    """A refusal sentence that keeps the prediction it was read from (for the frame)."""

    prediction: Prediction

    def __new__(cls, text: str, prediction: Prediction):
        s = super().__new__(cls, text)
        s.prediction = prediction
        return s


def _row(plan: Plan, p: Prediction, rank, fits: bool, note: str) -> dict:
    return {"rank": rank, "plan": plan.label, "sharding": plan.sharding, "dp": plan.dp, "tp": plan.tp, "pp": plan.pp,
            "schedule": plan.schedule, "micro_batches": plan.micro_batches, "micro_batch_size": plan.micro_batch_size,
            "checkpointing": plan.checkpointing, "fits": fits, "tokens_per_s_per_gpu": p.tokens_per_s_per_gpu,
            "mfu": p.mfu, "step_ms": p.step_s * 1e3, "compute_ms": p.compute_s * 1e3,
            "exposed_comm_ms": p.exposed_comm_s * 1e3, "bubble_ms": p.bubble_s * 1e3,
            "peak_gib": p.memory["peak"] / GIB, "note": note}


def _candidates(world: int) -> list[int]:
    """Degrees to try: the divisors of the GPUs and the powers of two up to them."""
    out = {d for d in range(1, world + 1) if world % d == 0}
    k = 1
    while k <= world:
        out.add(k)
        k *= 2
    return sorted(out)


def _micro_batch_sizes(rows: int) -> list[int]:
    """Rows per micro-batch that split a rank's `rows`: the powers of two dividing it, and all of it."""
    out = {rows}
    k = 1
    while k < rows:
        if rows % k == 0:
            out.add(k)
        k *= 2
    return sorted(out)


def _fixed(toggles: dict) -> dict:
    """The dimensions the given toggles fix: sharding, tp, pp (with schedule), checkpointing."""
    from ..toggles.pipeline_parallel import parse as parse_pp
    from ..toggles.tensor_parallel import parse as parse_tp

    fixed: dict = {}
    if "zero" in toggles:
        fixed["sharding"] = str(toggles["zero"]) if toggles["zero"] is not True else "zero1"
    elif "fsdp" in toggles or "ddp" in toggles:
        fixed["sharding"] = "fsdp" if "fsdp" in toggles else "ddp"
    if "tensor_parallel" in toggles:
        fixed["tp"] = parse_tp(toggles["tensor_parallel"])[0]
    if "pipeline_parallel" in toggles:
        value = toggles["pipeline_parallel"]
        schedule, _, stages = parse_pp("1f1b" if value is True else value)
        fixed["schedule"] = schedule
        if stages:
            fixed["pp"] = stages
    if "context_parallel" in toggles:
        fixed["cp"] = whole_degree(toggles, "context_parallel", 2, "ranks each sequence is split over")
    if "checkpointing" in toggles:
        c = toggles["checkpointing"]
        fixed["checkpointing"] = 1 if c is True else as_number(c)
    return fixed


def plan_for(model, gpus="8xH100-SXM", budget_bytes_per_gpu: float | None = None, batch_size: int | None = None,
             seq_len: int | None = None, toggles=None, per_node: int | None = None, efficiency=None,
             run_top: int = 0, run_steps: int = 6) -> PlanSearch:
    """Search the parallel plans of `model` on `gpus` for a global batch of `batch_size` sequences of `seq_len`
    tokens (default: one sequence per GPU), predict each with `predict`, drop those that do not fit
    `budget_bytes_per_gpu` (default: the part's memory) with the reason, and rank the rest by predicted tokens/s
    per GPU.  `toggles` are added to every plan (bf16, sdpa, ...); a parallel or checkpointing toggle among them
    fixes that dimension instead of searching it.  `run_top=k` runs the k best plans for `run_steps` steps on the
    ranks this machine starts (only where the plan's GPUs are this machine's: gpus='Nxthis-cpu') and puts the
    measured step beside the predicted one in `.measured`."""
    start = time.perf_counter()
    check_sizes(seq_len, batch_size)  # before a plan is tried: one refusal, not one per plan
    if isinstance(gpus, str) and gpus.strip().lower().split("x")[-1].strip() in ("this-cpu", "cpu"):
        from .calibrate import this_cpu

        this_cpu()  # measured on first use, as predict does
    cluster = parse_gpus(gpus, per_node)
    shape = shape_of(model)
    base = toggles_of(toggles)
    fixed = _fixed(base)
    # searched like the other dimensions: a value given is checked, and the notes say it was not kept
    accum = whole_degree(base, "grad_accum", 2, "micro-batches per step") if "grad_accum" in base else None
    base = {k: v for k, v in base.items() if k not in SEARCHED}
    budget = float(budget_bytes_per_gpu) if budget_bytes_per_gpu is not None else cluster.part.memory_bytes
    preset = _preset(model, shape)
    batch = batch_size if batch_size is not None else (preset.batch_size if preset else cluster.count)
    refused: list[tuple[object, str]] = []
    plans = _plans(cluster, shape, batch, fixed, refused)
    ranked = _ranked(_predicted(plans, model, cluster, base, batch, seq_len, efficiency, budget, refused))
    why = explain(ranked, budget)
    if not ranked:
        why.append(f"no plan fits {budget / GIB:.1f} GiB per GPU: of {len(plans)} plans predicted, the leanest "
                   + (_leanest(refused) or "could not be predicted (see refused)"))
    search = PlanSearch(shape.name if not isinstance(model, str) else model, cluster.describe(), batch,
                        ranked[0].prediction.seq_len if ranked else (seq_len or 0), budget, ranked, refused, why,
                        _notes(model, batch_size, batch, preset, fixed, accum), len(plans))
    if run_top:
        _run_top(search, model, cluster, base, run_top, run_steps)
    search.seconds = time.perf_counter() - start
    return search


def _predicted(plans, model, cluster, base, batch, seq_len, efficiency, budget, refused) -> list:
    """(plan, prediction) of each plan that fits `budget`; the others go to `refused` with the reason."""
    fits = []
    for plan in plans:
        try:
            pred = predict(model, cluster, toggles=plan.toggles(base), batch_size=batch, seq_len=seq_len,
                           efficiency=efficiency)
        except ConfigError as e:
            refused.append((plan, str(e)))
            continue
        if pred.memory["peak"] > budget:
            refused.append((plan, _Unfit(_unfit(pred, budget), pred)))
        else:
            fits.append((plan, pred))
    return fits


def _ranked(fits) -> list[Ranked]:
    """Fastest first; on equal throughput the plan with fewer parallel dimensions, then the smaller memory."""
    fits.sort(key=lambda pp_: (-pp_[1].tokens_per_s_per_gpu, pp_[0].dimensions, pp_[1].memory["peak"], pp_[0].label))
    return [Ranked(plan, pred) for plan, pred in fits]


def _notes(model, batch_size, batch, preset, fixed, accum=None) -> list[str]:
    notes = ["context parallel degrees 1, 2, 4 and 8 (within a node) are searched as ring attention (K/V blocks passed "
             "around the ring, hidden behind the attention's compute where they fit); tensor_parallel's "
             "sequence_parallel option is priced as plain tensor parallel; expert parallelism is not searched (no "
             "mixture-of-experts shapes)"]
    if batch_size is None:
        notes.append(f"batch_size not given: a global batch of {batch} sequences"
                     + (f", the preset {model}'s" if preset else ", one per GPU"))
    if fixed:
        notes.append("fixed by the toggles given: " + ", ".join(f"{k} {v}" for k, v in fixed.items()))
    if accum is not None:
        notes.append(f"grad_accum {accum} given, not kept: the micro-batches per data-parallel rank are searched "
                     f"(each plan's 'accum' or pipeline micro-batches)")
    return notes


def _tensor_degrees(cluster, shape, fixed: dict, refused: list) -> list[int]:
    """The tensor-parallel degrees that divide the GPUs, a node's GPUs and the heads; the others refused."""
    world, node, out = cluster.count, cluster.per_node, []
    for t in ([fixed["tp"]] if "tp" in fixed else _candidates(world)):
        if world % t:
            refused.append((f"tensor_parallel {t}", f"tensor_parallel {t} does not divide {world} GPUs"))
        elif t > node or node % t:
            refused.append((f"tensor_parallel {t}", f"tensor_parallel {t} does not divide the {node} GPUs of a node "
                            f"(its all-reduces sit on the critical path: the search keeps them inside a node)"))
        elif shape.n_head % t or shape.n_kv_head % t:
            refused.append((f"tensor_parallel {t}", f"tensor_parallel {t} does not divide the model's {shape.n_head} "
                            f"attention heads ({shape.n_kv_head} key/value heads): each rank takes whole heads"))
        else:
            out.append(t)
    return out


def _pipeline_degrees(cluster, shape, fixed: dict, refused: list) -> list[int]:
    """The pipeline degrees that divide the GPUs and the layers; the others refused."""
    world, out = cluster.count, []
    for p in ([fixed["pp"]] if "pp" in fixed else _candidates(world)):
        if world % p:
            refused.append((f"pipeline {p} stages", f"{p} pipeline stages do not divide {world} GPUs"))
        elif shape.n_layer % p:
            refused.append((f"pipeline {p} stages", f"{p} pipeline stages do not divide the model's "
                            f"{shape.n_layer} layers"))
        elif not (p == 1 and "schedule" in fixed):  # a pipeline toggle given: pipelines only
            out.append(p)
    return out


def _plans(cluster, shape, batch: int, fixed: dict, refused: list) -> list[Plan]:
    """Every plan of the degrees that divide, each sharding, schedule, checkpointing and micro-batch size."""
    world, out = cluster.count, []
    tps = _tensor_degrees(cluster, shape, fixed, refused)
    pps = _pipeline_degrees(cluster, shape, fixed, refused)
    cps = [fixed["cp"]] if "cp" in fixed else [c for c in (1, 2, 4, 8) if c <= min(world, cluster.per_node)]
    for t, p, c in ((t, p, c) for t in tps for p in pps for c in cps):
        cp_words = f" × context_parallel {c}" if c > 1 else ""
        degrees = f"tensor_parallel {t} × pipeline {p}{cp_words}"
        if world % (t * p * c):
            refused.append((degrees, f"tensor_parallel {t} × pipeline stages {p}{cp_words} = {t * p * c} does not "
                                     f"divide {world} GPUs"))
            continue
        dp = world // (t * p * c)
        if batch % dp:
            refused.append((f"{degrees} (data parallel {dp})",
                            f"batch_size {batch} does not split into {dp} data-parallel ranks"))
            continue
        rows = batch // dp
        shardings = [fixed["sharding"]] if "sharding" in fixed else (SHARDINGS if dp * c > 1 else ("none",))
        schedules = [fixed.get("schedule", "1f1b")] if p > 1 and "schedule" in fixed else \
            (SCHEDULES if p > 1 else (None,))
        ckpts = [fixed["checkpointing"]] if "checkpointing" in fixed else CHECKPOINTING
        for plan in (Plan(sharding, dp, t, p, schedule, rows // mbs, ckpt, mbs, c) for sharding in shardings
                     for schedule in schedules for ckpt in ckpts for mbs in _micro_batch_sizes(rows)):
            if plan.pp > plan.micro_batches:
                refused.append((plan, f"{plan.micro_batches} micro-batches for {plan.pp} pipeline stages: "
                                f"torch's pipeline schedules need at least one micro-batch per stage"))
            else:
                out.append(plan)
    return out


def _preset(model, shape):
    from ..models.presets import PRESETS

    return PRESETS.get(model) if isinstance(model, str) and shape.source.startswith("scalekit") else None


def _unfit(pred: Prediction, budget: float) -> str:
    parts = sorted(((k, v) for k, v in pred.memory.items() if k != "peak"), key=lambda kv: -kv[1])
    top = ", ".join(f"{k.replace('_', ' ')} {v / GIB:.1f}" for k, v in parts if v > 0)
    return (f"does not fit: {pred.memory['peak'] / GIB:.1f} GiB per GPU over the budget of {budget / GIB:.1f} "
            f"(by {(pred.memory['peak'] - budget) / GIB:.1f} GiB; {top} GiB)")


def _leanest(refused) -> str:
    unfit = [(p, r) for p, r in refused if isinstance(r, _Unfit)]
    if not unfit:
        return ""
    plan, reason = min(unfit, key=lambda pr: pr[1].prediction.memory["peak"])
    return f"{plan.label}: {reason}"


def _run_top(search: PlanSearch, model, cluster, base: dict, k: int, steps: int) -> None:
    """Run the k best plans on this machine's ranks (gloo on the CPU) and record measured against predicted."""
    if cluster.part.name != "this-cpu":
        search.notes.append(f"run_top={k}: not run: the plans are for {cluster.describe()}, and only this machine's "
                            f"ranks ('{cluster.count}xthis-cpu') can be started here")
        return
    if not isinstance(model, str):
        search.notes.append(f"run_top={k}: not run: runs take a built-in preset by name")
        return
    from ..launch import launch_run
    from ..training.config import RunConfig

    for r in search.plans[:k]:
        cfg = RunConfig(preset=model, toggles=r.plan.toggles(base), batch_size=search.batch_size,
                        seq_len=search.seq_len, steps=steps, warmup_steps=2, threads=1, device="cpu")
        try:
            if cluster.count > 1:
                result = launch_run(cfg, nprocs=cluster.count)
            else:
                from ..training.engine import run

                result = run(cfg)
        except Exception as e:  # a plan the run refuses: said beside the prediction
            search.notes.append(f"run_top: {r.plan.label} did not run: {type(e).__name__}: {e}")
            continue
        measured = result.median_step_ms
        if not measured:
            search.notes.append(f"run_top: {r.plan.label} measured no step ({result.status}: {result.error})")
            continue
        predicted = r.prediction.step_s * 1e3
        search.measured.append({"plan": r.plan.label, "toggles": r.plan.toggles(base), "predicted_ms": predicted,
                                "measured_ms": measured, "ratio": predicted / measured})


__all__ = ["plan_for", "PlanSearch", "Plan", "Ranked"]
