"""One candidate measured against the best in paired rounds, and the rules that keep it or not: the rounds
alternate who goes first; after MIN_ROUNDS the speed-up's interval (each look at LOOK_LEVEL) decides when it is
clear of 1 + MIN_GAIN, else the rounds go on to MAX_ROUNDS, time allowing; then the memory budget, the interval
and one-off costs against the run's length decide (`_judge`), the reason said in words."""

from __future__ import annotations

import statistics

from ..measure.stats import LEVEL, Interval, speedup_interval
from .budget import Budget
from .space import Candidate, Measurement, Search, SearchSpace, Standing

MIN_GAIN = 0.02  # a change must be at least 2% faster to be kept, whatever the noise
MIN_ROUNDS = 3  # paired rounds before the first look (best first, candidate first, best first)
MAX_ROUNDS = 6  # the second and last look, for a candidate whose interval still straddled 1 + MIN_GAIN
LOOK_LEVEL = 1 - (1 - LEVEL) / 2  # each of the two looks' level: 95% over both


def _samples(m: Measurement) -> list[float]:
    return list(m.samples) if m.samples else [1e3 / m.tokens_per_s]


def _measured(c: Candidate, cfg, result: Search, space: SearchSpace, budget: Budget, stop, budget_bytes,
              run_steps: int, uninterruptible: bool):
    """Measure `cfg` against the best in paired rounds until the interval decides; return the new best."""
    best, mine, theirs = result.best, [], []
    stopped = lambda: stop is not None and stop.is_set()  # noqa: E731
    while len(mine) < MAX_ROUNDS:
        pair = (best, cfg) if len(mine) % 2 == 0 else (cfg, best)  # alternate who goes first
        pair_s = sum(budget.expected_s(x, best, uninterruptible and x is cfg) for x in pair)
        if len(mine) >= MIN_ROUNDS:
            pair_s += budget.reserve_s  # an extra round leaves the changes still to come their rounds
        if stopped() or (mine and not budget.fits(pair_s)):
            break
        a = budget.measure(space, pair[0])
        if stopped():
            break
        b = budget.measure(space, pair[1])
        base, cand = (a, b) if pair[0] is best else (b, a)
        if base.failed:  # the best so far did not run again (or was stopped before it measured anything)
            c.reason = f"not measured: the best so far failed when measured beside it: {base.failed}"
            return best
        if cand.failed or cand.refused:
            c.reason = f"failed: {cand.failed}" if cand.failed else f"refused: {cand.refused}"
            return best
        mine.append(cand)
        theirs.append(base)
        c.interval = speedup_interval([_samples(m) for m in theirs], [_samples(m) for m in mine], LOOK_LEVEL)
        if _over(cand, budget_bytes) or (len(mine) == MIN_ROUNDS and _decided(c.interval)):
            break  # (a budget that ends the rounds between the looks makes that round the second look)
    best = _judge(c, cfg, mine, theirs, result, budget_bytes, run_steps)
    if note := next((m.note for m in mine if m.note), ""):  # what the runs said of the change (compile's capture)
        c.reason = f"{c.reason}; {note}" if c.reason else note
    return best


def _over(m: Measurement, budget_bytes) -> bool:
    return _over_budget(m.peak_bytes, budget_bytes)


def _over_budget(peak_bytes: int | None, budget_bytes: int | None) -> bool:
    return budget_bytes is not None and peak_bytes is not None and peak_bytes > budget_bytes


def _decided(interval: Interval) -> bool:
    """Another round would not change the decision: the interval is clear of 1 + MIN_GAIN, or the estimate
    itself is not above it (a gain this small is not worth more rounds)."""
    bar = 1 + MIN_GAIN
    return interval.low > bar or interval.high < bar or interval.estimate <= bar


def _judge(c: Candidate, cfg, mine: list[Measurement], theirs: list[Measurement], result: Search, budget_bytes,
           run_steps: int):
    """Keep `cfg` or not, from its rounds: the memory budget, then the interval, then one-off costs."""
    best = result.best
    if not mine:
        c.reason = "not measured: the time budget ran out before its first round"
        return best
    c.tokens_per_s = statistics.median(m.tokens_per_s for m in mine)
    c.best_tokens_per_s = statistics.median(m.tokens_per_s for m in theirs)
    result.best_tokens_per_s = c.best_tokens_per_s  # the best's latest measurement: the freshest figure
    peaks = [m.peak_bytes for m in mine if m.peak_bytes is not None]
    c.peak_bytes = max(peaks) if peaks else None
    c.compile_s = max(m.compile_s for m in mine)
    if budget_bytes is not None and c.peak_bytes is not None and c.peak_bytes > budget_bytes:
        c.reason = f"over budget when measured: {c.peak_bytes / 2**20:.1f} MiB > {budget_bytes / 2**20:.1f} MiB"
        return best
    if c.interval is not None:  # measured, in full or not: the final check weighs it (the best's chain, then it)
        result.standings.append(Standing(cfg, c.label, (*result.steps, c), c.tokens_per_s, c.peak_bytes))
    if len(mine) < MIN_ROUNDS:
        c.reason = f"not measured: the time budget left no room for its {MIN_ROUNDS} rounds"
        return best
    iv, bar = c.interval, 1 + MIN_GAIN
    figures = f"{iv.estimate:.3f}× ({iv.low:.3f}–{iv.high:.3f}× at {100 * iv.level:.0f}%, {iv.rounds} rounds)"
    if iv.low <= bar:
        c.reason = _not_kept(iv, figures, _over_budget(result.best_peak_bytes, budget_bytes))
        return best
    base_step_s = statistics.median(m.step_ms for m in theirs) / 1e3 if all(m.step_ms for m in theirs) else None
    if c.compile_s and base_step_s:
        saved = run_steps * base_step_s * (1 - 1 / iv.estimate)
        if saved <= c.compile_s:
            del result.standings[-1]  # faster per step at a cost this run cannot repay: no rival at the final check
            c.reason = (f"{iv.estimate:.2f}× faster per step, but over run_steps={run_steps} it saves {saved:.1f} s "
                        f"and costs {c.compile_s:.1f} s up front: not worth it for a run this short")
            return best
        return _accept(c, cfg, result, f"{figures} per step; over run_steps={run_steps} it saves {saved:.1f} s "
                                       f"for {c.compile_s:.1f} s of compilation")
    return _accept(c, cfg, result, f"faster: {figures}")


def _not_kept(iv: Interval, figures: str, best_over_budget: bool) -> str:
    """Why a candidate whose interval does not clear 1 + MIN_GAIN is not kept, in words."""
    bar = 1 + MIN_GAIN
    if best_over_budget:  # it fits where the best does not: the fastest that fits is crowned once all are tried
        return (f"fits the budget where the best does not, at {figures} the best's speed: crowned once every "
                f"change is tried if it is the fastest that fits")
    word = "slower" if iv.high < 1 else "too small a gain" if iv.high < bar else "within noise"
    cut = "" if _decided(iv) or iv.rounds >= MAX_ROUNDS else \
        " (the time budget left no room for more rounds beside the changes still to try)"
    if word == "within noise" and iv.estimate <= bar:
        cut = " (its estimate is not above that: more rounds would not make it a gain worth having)"
    return f"{word}: {figures}; kept only above {bar:.2f}×{cut}"


def _accept(c: Candidate, cfg, result: Search, reason: str):
    c.accepted, c.reason = True, reason
    result.best_tokens_per_s, result.best_peak_bytes = c.tokens_per_s, c.peak_bytes
    result.steps = (*result.steps, c)
    return cfg
