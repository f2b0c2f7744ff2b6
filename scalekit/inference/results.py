"""GenerateResult: what one measured generation measured, and side-by-side ratios of several."""

from __future__ import annotations

import math
import os
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from ..measure.attention_backend import backends_said
from ..measure.compiled import compile_flags
from ..measure.load import MachineLoad, any_busy, busiest
from ..measure.shared_results import STATUSES, Round, geometric_mean, not_like_for_like, write_results_json
from ..measure.stats import Interval, speedup_interval, too_few_steps, verdict
from ..measure.timing import Spread


@dataclass
class TokenRecord:
    """One decode step as streamed to callbacks and kept for plots: a new token for every prompt."""

    index: int  # 0: the first new token (from the prefill); 1, 2, ...: decode steps
    position: int  # its position in the (padded) sequence
    ms: float  # the time this token took: prefill + first sampling for index 0, one decode step after
    token_ids: list[int]  # the new token of each prompt
    texts: list[str]  # those tokens decoded
    accepted: int | None = None  # speculative decoding: draft tokens kept by the verification that made it


@dataclass
class GenerateResult:
    label: str
    config: dict
    status: str = "ok"  # one of measure.results.STATUSES
    error: str | None = None
    device: str = ""
    torch_version: str = ""
    batch_size: int = 0  # prompts generated together
    prompt_tokens: list[int] = field(default_factory=list)  # each prompt's length in tokens
    new_tokens: int = 0  # tokens generated after each prompt (fewer if stopped)
    texts: list[str] = field(default_factory=list)  # each prompt followed by what was generated
    token_ids: list[list[int]] = field(default_factory=list)  # the generated ids of each prompt
    # -- time (ms): measured after the warm-up, device-synchronized ----------------------------------
    prefill_ms: float | None = None  # the prompt's forward pass, filling the cache
    ttft_ms: float | None = None  # time to first token: from the prompt ids to the first new token
    token_ms: list[float] = field(default_factory=list)  # each decode step (tokens 2, 3, ...): for plots
    decode_ms: Spread | None = None  # over token_ms
    decode_ms_p90: float | None = None
    decode_tokens_per_s: float | None = None  # batch ÷ the median decode step (as training's tokens/s)
    decode_tokens_per_s_wall: float | None = None  # batch × decode steps ÷ their summed time (spikes included)
    total_s: float | None = None  # the whole measured generation, prefill included
    warmup_s: float | None = None  # the unmeasured warm-up generation
    compile_s: float | None = None  # warm-up decode steps beyond a steady step, when compile is on
    graphs_compiled: int | None = None  # graphs torch.compile made (warm-up and measured), when compile is on
    recompiles_measured: int | None = None  # of those, made during the measured generation (should be 0)
    graph_breaks: int | None = None  # places dynamo split the decode step, the code there run eagerly
    compile_note: str = ""  # what compile did not capture, in words ("": the whole step, or no compile)
    # the kernel of each SDPA call in the measured generation (measure.attention_backend): {"flash": 40}, {} when
    # none was seen (no SDPA call, or a compiled model, whose attention runs inside graphs)
    sdpa_backends: dict[str, int] = field(default_factory=dict)
    build_s: float | None = None
    # -- memory (bytes) ----------------------------------------------------------------------------------
    weight_bytes: int | None = None  # the weights as stored for this run (quantized formats counted as stored)
    weight_bytes_before: int | None = None  # the same model as built, before quantization
    kv_cache_bytes: int | None = None  # the cache at the end of the generation (0: no cache)
    peak_mem_bytes: int | None = None
    mem_source: str = ""
    # -- quality -----------------------------------------------------------------------------------------
    heldout_loss: float | None = None  # nats per token on held-out windows, this configuration's model
    perplexity: float | None = None  # exp(heldout_loss)
    reference_perplexity: float | None = None  # the model as built (fp32, unquantized) on the same windows
    agreement: float | None = None  # share of held-out positions where the greedy token equals the reference's
    same_prefix_tokens: list[int] | None = None  # greedy: tokens equal to the reference's greedy output, per prompt
    # -- speculative decoding (the speculative toggle) ----------------------------------------------------
    acceptance_rate: float | None = None  # draft tokens kept ÷ draft tokens proposed
    accepted_per_verification: float | None = None  # mean draft tokens kept per target forward that verified
    accepted_counts: list[int] = field(default_factory=list)  # verifications that kept 0, 1, ..., k draft tokens
    accepted_steps: list[int] = field(default_factory=list)  # draft tokens kept, verification by verification
    target_forwards_per_token: float | None = None  # forwards of the model per generated token (plain: 1)
    draft_forwards: int | None = None  # forwards of the draft model (0 for prompt lookup)
    draft_ms: float | None = None  # time spent proposing with the draft model, in the measured generation
    same_as_plain_tokens: int | None = None  # greedy: tokens equal to the plain loop's (same model), before any differs
    # -- the machine -------------------------------------------------------------------------------------
    threads: int | None = None  # torch's intra-op threads the generation computed on
    load: MachineLoad | None = None  # what else the machine ran meanwhile (the busiest round's, with repeats)
    rounds: list[Round] = field(default_factory=list)  # repeats: the later rounds' decode steps (token_ms is the first)
    notes: list[str] = field(default_factory=list)

    def record_speculation(self, accepted: list[int], drafted: list[int], target_forwards: int, draft_forwards: int,
                           draft_ms: float, k: int) -> None:
        """A speculative generation's figures: how often the draft was right, and what it cost."""
        self.accepted_steps = list(accepted)
        self.accepted_counts = [accepted.count(i) for i in range(k + 1)]
        self.acceptance_rate = sum(accepted) / sum(drafted) if sum(drafted) else None
        self.accepted_per_verification = sum(accepted) / len(accepted) if accepted else None
        made = len(accepted) + sum(accepted) + 1  # each verification's kept drafts and its own token, the first
        self.target_forwards_per_token = target_forwards / made
        self.draft_forwards, self.draft_ms = draft_forwards, draft_ms

    def timing_rounds(self) -> list[list[float]]:
        """Each round's decode-step times: this generation's own, then its repeats'."""
        return [list(self.token_ms), *(r.step_ms for r in self.rounds)]

    @property
    def all_decode_ms(self) -> Spread | None:
        """The spread of the decode steps over every round (decode_ms when there are no repeats)."""
        if not self.rounds:
            return self.decode_ms
        return Spread.of([ms for r in self.timing_rounds() for ms in r])

    @property
    def typical_decode_ms(self) -> float | None:
        """The median decode step; with repeats, the geometric mean of the rounds' medians."""
        if not self.rounds:
            return self.decode_ms.median if self.decode_ms and self.decode_ms.n else None
        rounds = [r for r in self.timing_rounds() if r]
        return geometric_mean([statistics.median(r) for r in rounds]) if rounds else None

    def add_round(self, again: GenerateResult) -> None:
        """Keep `again` (the same configuration generated once more) as a round; the figures become the rounds'."""
        self.rounds.append(Round(step_ms=list(again.token_ms), per_s_wall=again.decode_tokens_per_s_wall))
        self.load = busiest(self.load, again.load)
        if self.typical_decode_ms:
            self.decode_tokens_per_s = self.batch_size / (self.typical_decode_ms / 1e3)
        walls = [w for w in [self.decode_tokens_per_s_wall, *(r.per_s_wall for r in self.rounds)] if w]
        self.decode_tokens_per_s_wall = geometric_mean(walls) if walls else None

    @property
    def busy_note(self) -> str:
        return self.load.note if self.load is not None else ""

    @property
    def finished(self) -> bool:
        return self.status in ("ok", "stopped") and bool(self.token_ms or self.ttft_ms)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def flags(self) -> list[str]:
        """Marks a table shows beside the status ("compile no-op": compile was on and captured no graph)."""
        return compile_flags(self.graphs_compiled)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "busy": bool(self.busy_note), "flags": self.flags}

    def to_json(self, path: str | os.PathLike) -> None:
        """Write the full result as JSON, atomically."""
        write_results_json(path, self.to_dict())

    def summary_row(self) -> dict[str, Any]:
        d = self.all_decode_ms
        return {
            "run": self.label, "status": self.status, "flags": ", ".join(self.flags), "batch": self.batch_size,
            "decode_tokens_per_s": self.decode_tokens_per_s,
            "decode_ms": self.typical_decode_ms, "decode_ms_p25": d.p25 if d and d.n else None,
            "decode_ms_p75": d.p75 if d and d.n else None, "decode_ms_p90": self.decode_ms_p90,
            "prefill_ms": self.prefill_ms, "ttft_ms": self.ttft_ms,
            "weight_mb": _mb(self.weight_bytes), "kv_cache_mb": _mb(self.kv_cache_bytes),
            "peak_mem_mb": _mb(self.peak_mem_bytes), "perplexity": self.perplexity, "agreement": self.agreement,
            "acceptance": self.acceptance_rate, "target_forwards_per_token": self.target_forwards_per_token,
            "compile_s": self.compile_s, "threads": self.threads, "sdpa": backends_said(self.sdpa_backends),
            "note": self.error or "; ".join([*self.notes, *([self.busy_note] if self.busy_note else [])]),
        }


def _mb(n: int | None) -> float | None:
    return None if n is None else n / 2**20


def p90(values: list[float]) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=10, method="inclusive")[-1]


def generation_speedup(base: GenerateResult, r: GenerateResult) -> tuple[Interval | None, str]:
    """`r`'s decode speed-up over `base` per token, with its interval, and a note: how the two were made
    comparable, or why they are not (then None): a decode step's time grows with the sequence, so generations
    of different lengths are not compared."""
    if not (base.finished and r.finished):
        return None, ""
    why = not_like_for_like(base, r)
    if not why and (base.new_tokens != r.new_tokens or max(base.prompt_tokens) != max(r.prompt_tokens)):
        what = f"{r.new_tokens} against {base.new_tokens} new tokens" if base.new_tokens != r.new_tokens else \
            f"prompts of {max(r.prompt_tokens)} against {max(base.prompt_tokens)} tokens"
        why = f"not compared: {what} (a decode step's time grows with the sequence: generate the same length)"
    if why:
        return None, why
    interval = speedup_interval(base.timing_rounds(), r.timing_rounds(), busy=any_busy(base.load, r.load))
    if interval is None:
        return None, too_few_steps(base.timing_rounds(), r.timing_rounds())
    if base.batch_size == r.batch_size:
        return interval, ""
    return interval.scaled(r.batch_size / base.batch_size), \
        f"per token: a batch of {r.batch_size} against {base.batch_size} prompts"


def compare_generations(results: list[GenerateResult]):
    """A DataFrame, one row per generation, with the decode speed-up per token (its 95% interval and verdict:
    faster, slower or within noise) and weight ratio against the first generation that measured."""
    import pandas as pd

    rows = [r.summary_row() for r in results]
    df = pd.DataFrame(rows)
    base = next((r for r in results if r.finished and r.decode_tokens_per_s), None)
    if rows:
        found = [generation_speedup(base, r) if base and r is not base else (None, "") for r in results]
        df["speedup"] = [1.0 if r is base else iv.estimate if iv else None for r, (iv, _) in zip(results, found,
                                                                                                  strict=True)]
        df["speedup_low"] = [iv.low if iv else None for iv, _ in found]
        df["speedup_high"] = [iv.high if iv else None for iv, _ in found]
        df["verdict"] = ["baseline" if r is base else verdict(iv) for r, (iv, _) in zip(results, found, strict=True)]
        df["note"] = ["; ".join(n for n in (why, note) if n) for (_, why), note in zip(found, df["note"], strict=True)]
        base_row = base.summary_row() if base else {}
        df["weight_ratio"] = [_ratio(r["weight_mb"], base_row.get("weight_mb")) for r in rows]
    cols = ["run", "status", "flags", "batch", "decode_tokens_per_s", "speedup", "speedup_low", "speedup_high", "verdict",
            "decode_ms", "decode_ms_p25", "decode_ms_p75", "decode_ms_p90", "prefill_ms", "ttft_ms", "weight_mb",
            "weight_ratio", "kv_cache_mb", "peak_mem_mb", "perplexity", "agreement", "acceptance",
            "target_forwards_per_token", "compile_s", "threads", "sdpa", "note"]
    return df.reindex(columns=cols)


def _ratio(num, den):
    if num is None or den is None or not den or (isinstance(num, float) and math.isnan(num)):
        return None
    return num / den


__all__ = ["GenerateResult", "TokenRecord", "compare_generations", "generation_speedup", "STATUSES"]
