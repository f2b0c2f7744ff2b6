"""The search autotune runs, apart from how a configuration is measured (so tests can script the machine).

Greedy and honest: start from the baseline (the user's configuration with no toggle on); try the toggles the
user chose as one candidate (a choice is a candidate, not a floor: kept only if it beats the baseline, and each
of its toggles tried switched off again at the end); try one change at a time, in the order a
practitioner would (what each toggle is for: precision, kernels, shapes, the optimizer, compile, the
data pipeline, then batch size); drop a candidate that cannot run here, cannot go with what is already on,
or that the planner says cannot fit the memory budget, before spending any time on it; measure every other
candidate against the current best side by side, in paired rounds whose order alternates (best first, then
the candidate first, ...).  After MIN_ROUNDS rounds, the speed-up's confidence interval
(scalekit.measure.stats) decides: kept when its whole interval is above 1 + MIN_GAIN, dropped when it is
below, or when the estimate itself is not above it; otherwise the rounds go on to MAX_ROUNDS, time budget
allowing, and decide there.  Two looks (Bonferroni: each at LOOK_LEVEL), so that a change that does nothing
is kept in at most 1 - LEVEL of searches; two rounds alone never decide (Student's t with one degree of
freedom is too wide to), which is why the first look waits for three.  One-off costs (compile time) are weighed
against the length of the real run the user plans.

The time budget is kept: a measurement is started only when what this machine has shown such a run to cost
fits in what is left, and a run under way stops at its next step when the budget ends.  The one thing no
stop flag can cut short is a compilation: a change declared uninterruptible is budgeted from the first one
seen, and the search says at its start that that first one may run past the budget.

The winner is checked against every configuration measured that fits the memory budget.  Each measured
configuration is linked to the baseline by a chain of paired intervals (each change measured against the best of
its time); two configurations compare through the links their chains do not share, multiplied (`product`).  One
that is faster than the winner beyond noise, and by more than MIN_GAIN (what any change must gain to be kept),
is crowned instead (`verdict`), and the table gains a row saying so.  While the best is over the memory budget, a
candidate that fits is kept at once only when it is also faster; one that fits but is not waits, and once every
change has been tried the fastest that fits is crowned (the first thing that fits is not the winner merely for
being first), and the changes refused for the memory of the best that did not fit are tried again on it.

This module is the loop: the order changes are tried in, and what is tried again once they are settled.  What it
works with is in autotune.space, its time in autotune.budget, the refusals before measuring in autotune.pruning,
the paired rounds and the rule that keeps a change in autotune.paired, the final check in autotune.crown, and
what it says beside its table in autotune.notes.
"""

from __future__ import annotations

import dataclasses
import time

from ..errors import NothingFits
from .budget import Budget
from .crown import _crown
from .notes import _say_given, _say_overrun, _say_uninterruptible
from .paired import MIN_ROUNDS, _measured, _over_budget
from .pruning import _measured_already, _over_plan, _pruned
from .space import Candidate, Search, SearchSpace, Standing, config_key


def search(start, space: SearchSpace, budget_bytes: int | None = None, time_budget_s: float = 300.0,
           run_steps: int = 1000, stop=None, on_candidate=None, clock=time.monotonic, on_note=None,
           from_baseline: bool = True) -> Search:
    """Greedy search over `space` from the baseline (`start` with no toggle on; `from_baseline=False`: from
    `start` itself), `start`'s toggles tried as one candidate and then switched off one by one; see the module
    docstring.  `on_note(text)` hears what the search says before it starts (and result.notes keeps it)."""
    budget = Budget(clock, time_budget_s, getattr(stop, "started", None))
    origin = dataclasses.replace(start, toggles={}) if from_baseline and start.toggles else start
    result = Search(start=start, best=origin, best_tokens_per_s=None, best_peak_bytes=None, baseline=origin)
    _say_uninterruptible(result, space, time_budget_s, on_note)
    _say_given(result, on_note)
    first = budget.measure(space, origin)
    if stop is not None and stop.is_set():
        result.best = start  # nothing measured: what was handed comes back unchanged
        result.stopped, result.elapsed_s = "stopped", budget.elapsed()
        return result
    if first.failed:
        raise RuntimeError(f"the starting configuration does not run: {first.failed}")
    result.best_tokens_per_s, result.best_peak_bytes = first.tokens_per_s, first.peak_bytes
    result.standings.append(Standing(origin, origin.describe(), (), first.tokens_per_s, first.peak_bytes))
    if budget_bytes is not None and first.peak_bytes is not None and first.peak_bytes > budget_bytes:
        result.notes.append(f"the starting configuration's measured peak ({first.peak_bytes / 2**20:.1f} MiB) is over "
                            f"the budget ({budget_bytes / 2**20:.1f} MiB): only changes that bring it under are kept")
    changes = [*_as_given(start, origin), *space.changes]
    left_out = 0  # candidates not tried because their rounds would have ended past the budget
    for i, (label, change) in enumerate(_attempts(result, space, changes, budget_bytes, on_candidate)):
        if _out_of_time(result, budget, stop, 0.0):
            break
        candidate = _candidate(result.best, label, change)
        # rounds beyond the first MIN_ROUNDS leave the changes still to come time for theirs
        budget.reserve_s = _likely_measured(space, changes[i + 1:]) * MIN_ROUNDS * 2 * \
            budget.expected_s(result.best, result.best, False)
        left_out += _try(candidate, label, space, result, budget, stop, budget_bytes, run_steps)
        result.candidates.append(candidate)
        if on_candidate is not None:
            on_candidate(candidate, result)
        if result.stopped:
            break
    if left_out and not result.stopped:
        result.stopped = f"time budget ({time_budget_s:g} s): {left_out} candidate(s) not tried"
    _crown(result, budget_bytes, on_candidate)
    result.elapsed_s = budget.elapsed()
    _say_overrun(result, space, time_budget_s)
    if budget_bytes is not None and result.best_peak_bytes is not None and result.best_peak_bytes > budget_bytes:
        raise NothingFits(f"no configuration tried fits {budget_bytes / 2**20:.1f} MiB: the best measured peak is "
                          f"{result.best_peak_bytes / 2**20:.1f} MiB", result)
    return result


def _as_given(start, origin) -> list[tuple[str, dict]]:
    """The toggles the user chose, as the first candidate against the baseline (none when the search starts
    from them, or they chose none)."""
    if origin is start:
        return []
    return [(f"as given ({start.describe()})", dict(start.toggles))]


def _attempts(result: Search, space: SearchSpace, changes, budget_bytes, on_candidate):
    """The changes in the order they are tried; then, once the toggles are settled (and the fastest
    configuration that fits crowned, if the best does not), larger batches and the chosen toggles switched off."""
    yield from changes
    over = _over_budget(result.best_peak_bytes, budget_bytes)
    _crown(result, budget_bytes, on_candidate)
    if over and result.crowned:  # the best fits now: what was refused for the memory of one that did not, again
        refused = {c.label for c in result.candidates if c.reason.startswith("over budget")}
        yield from ((label, change) for label, change in changes if label in refused and label not in space.memory_only)
    # larger batches, for whatever configuration is best once the toggles are settled
    yield from ((f"batch_size={b}", {"batch_size": b}) for b in space.batch_sizes(result.best, budget_bytes))
    # what the user chose and the best still has: is each of those toggles worth having, with all else settled?
    for name, value in result.start.toggles.items():
        toggles = {k: v for k, v in result.best.toggles.items() if k != name}
        if result.best.toggles.get(name) == value and not _was_measured(result, toggles, result.best):
            yield f"without {name}", {name: False}


def _was_measured(result: Search, toggles: dict, like) -> bool:
    key = config_key(dataclasses.replace(like, toggles=toggles, label=None))
    return any(config_key(s.config) == key for s in result.standings)


def _likely_measured(space: SearchSpace, changes) -> int:
    """How many of `changes` will be measured, as far as can be told without the best they will meet: the
    memory levers and what cannot run here are not."""
    def runs(name, value) -> bool:
        return (space.available(name) if space.choice_available is None else space.choice_available(name, value))[0]

    return sum(label not in space.memory_only and all(runs(n, v) for n, v in change.items() if v is not False)
               for label, change in changes)


def _try(c: Candidate, label: str, space: SearchSpace, result: Search, budget: Budget, stop, budget_bytes,
         run_steps: int) -> bool:
    """Refuse `c` up front, or measure it against the best and keep it or not (the reason in c.reason).
    True: not tried, because its rounds would not end inside the time budget."""
    fits = budget_bytes is None or (result.best_peak_bytes or 0) <= budget_bytes
    if label in space.memory_only and fits:
        c.reason = "not tried: the best already fits the budget, and this lever trades speed for memory"
        return False
    if _pruned(c, space, result.best):
        return False
    cfg = _configured(c, result.best)
    if _over_plan(c, cfg, space, budget_bytes) or _measured_already(c, cfg, result):
        return False
    pair_s = budget.expected_s(cfg, result.best, label in space.uninterruptible) + \
        budget.expected_s(result.best, result.best, False)
    if not budget.fits(MIN_ROUNDS * pair_s):
        c.reason = (f"not tried: its {MIN_ROUNDS} rounds (≈{MIN_ROUNDS * pair_s:.0f} s here) would not end inside "
                    f"the time budget ({budget.budget_s - budget.elapsed():.0f} s left)")
        return True
    before = result.best, result.best_tokens_per_s, result.best_peak_bytes, result.steps, len(result.standings)
    result.best = _measured(c, cfg, result, space, budget, stop, budget_bytes, run_steps,
                            label in space.uninterruptible)
    if stop is not None and stop.is_set():  # its runs were cut short: not a measurement
        result.best, result.best_tokens_per_s, result.best_peak_bytes, result.steps, kept = before
        del result.standings[kept:]
        result.stopped = getattr(stop, "why", "stopped")
        c.accepted, c.reason, c.interval = False, f"{result.stopped} during its measurement", None
    return False


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


def _out_of_time(result: Search, budget: Budget, stop, next_s: float) -> bool:
    """Stop before work that would end after the time budget (`next_s`: what it is expected to take)."""
    if stop is not None and stop.is_set():
        result.stopped = getattr(stop, "why", "stopped")
    elif not budget.fits(next_s):
        result.stopped = f"time budget ({budget.budget_s:g} s) reached"
    return bool(result.stopped)
