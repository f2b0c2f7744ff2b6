"""The search autotune runs, apart from how a configuration is measured (so tests can script the machine).

Greedy and honest: start from the user's configuration; try one change at a time, in the order a
practitioner would (what each toggle is for: precision, kernels, shapes, the optimizer, compile, the
data pipeline, then batch size); drop a candidate that cannot run here, cannot go with what is already on,
or that the planner says cannot fit the memory budget, before spending any time on it; measure every other
candidate against the current best side by side (paired runs, the order alternating), and keep it only
when its gain is larger than the noise the pairs themselves show.  One-off costs (compile time) are weighed
against the length of the real run the user plans.  The search stops cleanly when its time budget runs out
or `stop` is set, returning the best configuration found so far.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import NothingFits

MIN_GAIN = 0.02  # a change must be at least 2% faster to be kept, whatever the noise
ROUNDS = 2  # paired rounds per candidate: best then candidate, then candidate then best
DEADLINE_MARGIN = 0.05  # a measurement under way is stopped this share of the time budget before its end


@dataclass
class Measurement:
    """What one measured run of a configuration gives the search."""

    tokens_per_s: float
    peak_bytes: int | None
    compile_s: float = 0.0  # one-off cost paid at the start of a real run
    step_ms: float | None = None
    failed: str | None = None  # an error, in plain words
    refused: str | None = None  # it ran, but its result is not acceptable (e.g. generation quality), and why


class Deadline:
    """A stop flag that is also set once `seconds` have passed: measurements (which check their stop flag every
    step) end at the time budget instead of overrunning it by a candidate.  `why` says which it was."""

    def __init__(self, seconds: float, stop=None, clock=time.monotonic):
        # set a little early: a run checks its stop flag once a step, and then ends (its last step, its
        # clean-up), so the search as a whole still ends inside `seconds`
        self.end, self.stop, self.clock = clock() + seconds - min(10.0, DEADLINE_MARGIN * seconds), stop, clock
        self.seconds = seconds

    def is_set(self) -> bool:
        return (self.stop is not None and self.stop.is_set()) or self.clock() >= self.end

    @property
    def why(self) -> str:
        if self.stop is not None and self.stop.is_set():
            return "stopped"
        return f"time budget ({self.seconds:g} s) reached"


@dataclass
class Candidate:
    """One change tried, and what became of it."""

    label: str
    toggles: dict  # the whole configuration's toggles with the change
    batch_size: int | None
    accepted: bool = False
    reason: str = ""  # why it was kept or not, in words
    speedup: float | None = None  # median of the paired ratios against the best at the time
    noise: float | None = None  # half the spread of those ratios
    tokens_per_s: float | None = None
    peak_bytes: int | None = None
    compile_s: float | None = None


@dataclass
class Search:
    """The search's outcome: the chosen configuration, the path to it and every candidate."""

    start: Any  # the RunConfig it began from
    best: Any  # the RunConfig chosen
    best_tokens_per_s: float | None
    best_peak_bytes: int | None
    candidates: list[Candidate] = field(default_factory=list)
    elapsed_s: float = 0.0
    stopped: str = ""  # why it stopped early, if it did ("time budget", "stopped")
    notes: list[str] = field(default_factory=list)

    @property
    def path(self) -> list[Candidate]:
        return [c for c in self.candidates if c.accepted]

    @property
    def rejected(self) -> list[Candidate]:
        return [c for c in self.candidates if not c.accepted]


@dataclass
class SearchSpace:
    """What to try, and how the search learns about the machine (injected, so it can be scripted)."""

    changes: Sequence[tuple[str, dict]]  # (label, toggles to set) in the order they are tried
    available: Callable[[str], tuple[bool, str]]  # toggle name -> (ok, why not)
    conflicts: Callable[[dict], str | None]  # toggles -> why they cannot go together (None: they can)
    planned_peak: Callable[[Any], int | None]  # config -> the planner's peak bytes (None: cannot plan)
    measure: Callable[[Any], Measurement]
    batch_sizes: Callable[[Any, int | None], list[int]] = lambda cfg, budget: []  # larger batches to try
    memory_only: frozenset = frozenset()  # labels of changes tried only while the best is over the budget
    # (toggle name, value) -> (ok, why not), for toggles whose modes differ in what runs here (quantize
    # methods); None: `available` alone decides
    choice_available: Callable[[str, Any], tuple[bool, str]] | None = None


def search(start, space: SearchSpace, budget_bytes: int | None = None, time_budget_s: float = 300.0,
           run_steps: int = 1000, stop=None, on_candidate=None, clock=time.monotonic) -> Search:
    """Greedy search from `start` (a RunConfig) over `space`; see the module docstring."""
    t0 = clock()
    first = space.measure(start)
    one_run_s = clock() - t0  # what one measurement costs here: a candidate takes 2 × ROUNDS of them
    if stop is not None and stop.is_set():
        return Search(start=start, best=start, best_tokens_per_s=None, best_peak_bytes=None, stopped="stopped",
                      elapsed_s=clock() - t0)
    if first.failed:
        raise RuntimeError(f"the starting configuration does not run: {first.failed}")
    result = Search(start=start, best=start, best_tokens_per_s=first.tokens_per_s, best_peak_bytes=first.peak_bytes)
    if budget_bytes is not None and first.peak_bytes is not None and first.peak_bytes > budget_bytes:
        result.notes.append(f"the starting configuration's measured peak ({first.peak_bytes / 2**20:.1f} MiB) is over "
                            f"the budget ({budget_bytes / 2**20:.1f} MiB): only changes that bring it under are kept")

    def attempts():
        yield from space.changes
        # larger batches, for whatever configuration is best once the toggles are settled
        yield from ((f"batch_size={b}", {"batch_size": b}) for b in space.batch_sizes(result.best, budget_bytes))

    for label, change in attempts():
        if _out_of_time(result, clock, t0, time_budget_s, stop, 2 * ROUNDS * one_run_s):
            break
        candidate = _candidate(result.best, label, change)
        fits = budget_bytes is None or (result.best_peak_bytes or 0) <= budget_bytes
        if label in space.memory_only and fits:
            candidate.reason = "not tried: the best already fits the budget, and this lever trades speed for memory"
        elif not _pruned(candidate, space, result.best):
            cfg = _configured(candidate, result.best)
            if not _over_plan(candidate, cfg, space, budget_bytes):
                before = result.best, result.best_tokens_per_s, result.best_peak_bytes
                result.best = _measured(candidate, cfg, result.best, result, space, budget_bytes, run_steps)
                if stop is not None and stop.is_set():  # its runs were cut short: not a measurement
                    result.best, result.best_tokens_per_s, result.best_peak_bytes = before
                    result.stopped = getattr(stop, "why", "stopped")
                    candidate.accepted, candidate.reason = False, f"{result.stopped} during its measurement"
        result.candidates.append(candidate)
        if on_candidate is not None:
            on_candidate(candidate, result)
        if result.stopped:
            break
    result.elapsed_s = clock() - t0
    if budget_bytes is not None and result.best_peak_bytes is not None and result.best_peak_bytes > budget_bytes:
        raise NothingFits(f"no configuration tried fits {budget_bytes / 2**20:.1f} MiB: the best measured peak is "
                          f"{result.best_peak_bytes / 2**20:.1f} MiB", result)
    return result




def _candidate(best, label: str, change: dict) -> Candidate:
    """The candidate for `change` on top of `best` (a toggle set to False is switched off)."""
    change = dict(change)
    batch = change.pop("batch_size", getattr(best, "batch_size", None))  # (a generation has prompts, no batch)
    toggles = {k: v for k, v in {**best.toggles, **change}.items() if v is not False}
    return Candidate(label=label, toggles=toggles, batch_size=batch)


def _configured(c: Candidate, best):
    sizes = {"batch_size": c.batch_size} if hasattr(best, "batch_size") else {}
    cfg = dataclasses.replace(best, toggles=c.toggles, label=None, **sizes)
    c.toggles = dict(cfg.toggles)  # normalised (a mode for True, in application order)
    return cfg


def _out_of_time(result: Search, clock, t0: float, time_budget_s: float, stop, next_s: float) -> bool:
    """Stop before a candidate that would end after the time budget (`next_s`: what one is expected to take)."""
    if stop is not None and stop.is_set():
        result.stopped = getattr(stop, "why", "stopped")
    elif clock() - t0 + next_s > time_budget_s:
        result.stopped = f"time budget ({time_budget_s:g} s) reached"
    return bool(result.stopped)


def _pruned(c: Candidate, space: SearchSpace, best) -> bool:
    """Refuse a candidate before building it, saying why (True: refused)."""
    new = {k: v for k, v in c.toggles.items() if best.toggles.get(k) != v}
    for name in new:
        ok, why = space.available(name) if space.choice_available is None else \
            space.choice_available(name, c.toggles[name])
        if not ok:
            c.reason = f"unavailable here: {why}"
            return True
    conflict = space.conflicts(c.toggles)
    if conflict:
        c.reason = f"cannot go with what is on: {conflict}"
        return True
    if not new and c.toggles.keys() == best.toggles.keys() and c.batch_size == getattr(best, "batch_size", None):
        c.reason = "already on"
        return True
    return False


def _over_plan(c: Candidate, cfg, space: SearchSpace, budget_bytes) -> bool:
    """The planner's verdict, before any time is spent measuring (True: refused)."""
    if budget_bytes is None:
        return False
    planned = space.planned_peak(cfg)
    if planned is not None and planned > budget_bytes:
        c.reason = f"over budget by the planner: {planned / 2**20:.1f} MiB planned > {budget_bytes / 2**20:.1f} MiB"
        return True
    return False


def _measured(c: Candidate, cfg, best, result: Search, space: SearchSpace, budget_bytes, run_steps: int):
    """Measure `cfg` against `best` in paired rounds; return the new best (cfg if accepted)."""
    ratios, mine, theirs = [], [], []
    for k in range(ROUNDS):
        pair = (best, cfg) if k % 2 == 0 else (cfg, best)  # alternate who goes first
        a, b = (space.measure(x) for x in pair)
        base, cand = (a, b) if k % 2 == 0 else (b, a)
        if base.failed:  # the best so far did not run again (or was stopped before it measured anything)
            c.reason = f"not measured: the best so far failed when measured beside it: {base.failed}"
            return best
        if cand.failed or cand.refused:
            c.reason = f"failed: {cand.failed}" if cand.failed else f"refused: {cand.refused}"
            return best
        ratios.append(cand.tokens_per_s / base.tokens_per_s)
        mine.append(cand)
        theirs.append(base)
    c.speedup = statistics.median(ratios)
    c.noise = (max(ratios) - min(ratios)) / 2
    c.tokens_per_s = statistics.median(m.tokens_per_s for m in mine)
    peaks = [m.peak_bytes for m in mine if m.peak_bytes is not None]
    c.peak_bytes = max(peaks) if peaks else None
    c.compile_s = max(m.compile_s for m in mine)
    over = budget_bytes is not None and c.peak_bytes is not None and c.peak_bytes > budget_bytes
    best_over = budget_bytes is not None and result.best_peak_bytes is not None and result.best_peak_bytes > budget_bytes
    if over:
        c.reason = f"over budget when measured: {c.peak_bytes / 2**20:.1f} MiB > {budget_bytes / 2**20:.1f} MiB"
        return best
    if best_over:  # anything that fits beats a best that does not
        return _accept(c, cfg, result, "brings the peak under the budget")
    gain = c.speedup - 1
    if gain <= max(MIN_GAIN, c.noise):
        c.reason = ("slower" if gain < -max(MIN_GAIN, c.noise) else "within noise") + \
            f": {c.speedup:.3f}× (noise ±{c.noise:.3f}, at least {1 + MIN_GAIN:.2f}× needed)"
        return best
    base_step_s = statistics.median(m.step_ms for m in theirs if m.step_ms) / 1e3 if all(m.step_ms for m in theirs) \
        else None
    if c.compile_s and base_step_s:
        saved = run_steps * base_step_s * (1 - 1 / c.speedup)
        if saved <= c.compile_s:
            c.reason = (f"{c.speedup:.2f}× faster per step, but over run_steps={run_steps} it saves {saved:.1f} s and "
                        f"costs {c.compile_s:.1f} s up front: not worth it for a run this short")
            return best
        return _accept(c, cfg, result, f"{c.speedup:.2f}× per step; over run_steps={run_steps} it saves {saved:.1f} s "
                                       f"for {c.compile_s:.1f} s of compilation")
    return _accept(c, cfg, result, f"{c.speedup:.2f}× faster (noise ±{c.noise:.3f})")


def _accept(c: Candidate, cfg, result: Search, reason: str):
    c.accepted, c.reason = True, reason
    result.best_tokens_per_s, result.best_peak_bytes = c.tokens_per_s, c.peak_bytes
    return cfg
