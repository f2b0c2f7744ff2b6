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
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import NothingFits
from ..measure.stats import LEVEL, Interval, product, sentence, speedup_interval, verdict

MIN_GAIN = 0.02  # a change must be at least 2% faster to be kept, whatever the noise
MIN_ROUNDS = 3  # paired rounds before the first look (best first, candidate first, best first)
MAX_ROUNDS = 6  # the second and last look, for a candidate whose interval still straddled 1 + MIN_GAIN
LOOK_LEVEL = 1 - (1 - LEVEL) / 2  # each of the two looks' level: 95% over both
DEADLINE_MARGIN = 0.05  # a measurement under way is stopped this share of the time budget before its end
CROWNED = "crowned: "  # the label of the row that says the final check chose another configuration


@dataclass
class Measurement:
    """What one measured run of a configuration gives the search."""

    tokens_per_s: float
    peak_bytes: int | None
    compile_s: float = 0.0  # one-off cost paid at the start of a real run
    step_ms: float | None = None
    failed: str | None = None  # an error, in plain words
    refused: str | None = None  # it ran, but its result is not acceptable (e.g. generation quality), and why
    # its measured steps' times per token (any unit): the run's own spread, a floor under the rounds' (none:
    # the rounds alone say how noisy it is)
    samples: tuple[float, ...] = ()
    wall_s: float | None = None  # how long the measurement took (the search sets it)
    note: str = ""  # what the run said that bears on the change (compile that captured no graph, ...)


class Deadline:
    """A stop flag that is also set once `seconds` have passed: measurements (which check their stop flag every
    step) end at the time budget instead of overrunning it by a candidate.  `why` says which it was."""

    def __init__(self, seconds: float, stop=None, clock=time.monotonic):
        # set a little early: a run checks its stop flag once a step, and then ends (its last step, its
        # clean-up), so the search as a whole still ends inside `seconds`
        self.end, self.stop, self.clock = clock() + seconds - min(10.0, DEADLINE_MARGIN * seconds), stop, clock
        self.seconds = seconds
        self.started = clock()

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
    interval: Interval | None = None  # its speed-up over the best at the time, from the paired rounds
    tokens_per_s: float | None = None  # the candidate's, median over its rounds
    best_tokens_per_s: float | None = None  # the best's, measured in the same rounds
    peak_bytes: int | None = None
    compile_s: float | None = None

    @property
    def speedup(self) -> float | None:
        return self.interval.estimate if self.interval else None

    @property
    def rounds(self) -> int:
        return self.interval.rounds if self.interval else 0


@dataclass
class Standing:
    """A configuration the search measured, and the candidates whose paired intervals chain it to the baseline
    (each measured against the best of its time; none for the baseline itself)."""

    config: Any
    label: str  # how the search reached it: "baseline" or the candidate's label
    steps: tuple[Candidate, ...]
    tokens_per_s: float | None
    peak_bytes: int | None

    @property
    def estimate(self) -> float:
        """Its speed-up over the baseline (the chain's estimates multiplied)."""
        return math.prod(c.interval.estimate for c in self.steps)


@dataclass
class Search:
    """The search's outcome: the chosen configuration, the path to it and every candidate."""

    start: Any  # the RunConfig it was handed
    best: Any  # the RunConfig chosen
    best_tokens_per_s: float | None
    best_peak_bytes: int | None
    candidates: list[Candidate] = field(default_factory=list)
    elapsed_s: float = 0.0
    stopped: str = ""  # why it stopped early, if it did ("time budget", "stopped")
    notes: list[str] = field(default_factory=list)
    baseline: Any = None  # the configuration measured first, that every speed-up is chained to
    steps: tuple[Candidate, ...] = ()  # the candidates that chain the best to the baseline
    standings: list[Standing] = field(default_factory=list)  # every configuration measured, in order

    @property
    def speedup_vs_start(self) -> Interval | None:
        """The best's speed-up over the baseline: the paired speed-ups of its chain multiplied (None: it is the
        baseline)."""
        return product([c.interval for c in self.steps])

    @property
    def path(self) -> list[Candidate]:
        """The changes that make the best, in the order they were measured."""
        return list(self.steps)

    @property
    def crowned(self) -> list[Candidate]:
        """The rows where the final check chose a configuration the greedy path had not."""
        return [c for c in self.candidates if c.label.startswith(CROWNED)]

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
    uninterruptible: frozenset = frozenset()  # labels of changes whose runs start with a compile


class Budget:
    """The search's time: what is left of the budget, and what runs have cost here so far, so that a run is
    started only when it is expected to end inside the budget."""

    def __init__(self, clock, budget_s: float, started: float | None = None):
        self.clock, self.budget_s = clock, budget_s
        self.t0 = clock() if started is None else started
        self.last_s: dict[Any, float] = {}  # configuration -> how long its last measurement took
        self.one_off_s = 0.0  # the largest uninterruptible cost (compilation) seen so far
        self.reserve_s = 0.0  # time kept for the candidates still to come: extra rounds may not spend it

    def elapsed(self) -> float:
        return self.clock() - self.t0

    def fits(self, seconds: float) -> bool:
        return self.elapsed() + seconds <= self.budget_s

    def measure(self, space: SearchSpace, cfg) -> Measurement:
        t = self.clock()
        m = space.measure(cfg)
        m.wall_s = self.clock() - t
        self.last_s[config_key(cfg)] = m.wall_s
        self.one_off_s = max(self.one_off_s, m.compile_s or 0.0)
        return m

    def expected_s(self, cfg, like, uninterruptible: bool) -> float:
        """What measuring `cfg` should take: its own last run, else `like`'s plus the one-off cost it adds."""
        if config_key(cfg) in self.last_s:
            return self.last_s[config_key(cfg)]
        return self.last_s.get(config_key(like), 0.0) + (self.one_off_s if uninterruptible else 0.0)


def config_key(cfg) -> tuple:
    """One configuration's identity in a search: its toggles and batch."""
    return tuple(sorted((k, str(v)) for k, v in cfg.toggles.items())), getattr(cfg, "batch_size", None)


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


def _say_uninterruptible(result: Search, space: SearchSpace, time_budget_s: float, on_note) -> None:
    slow = [label for label, _ in space.changes if label in space.uninterruptible]
    if not slow:
        return
    note = (f"{', '.join(slow)}: a compilation cannot be stopped part-way, so the first one may run past the "
            f"{time_budget_s:g} s budget by what it takes; later ones are tried only when what the first took fits")
    result.notes.append(note)
    if on_note is not None:
        on_note(note)


def _say_given(result: Search, on_note) -> None:
    """What becomes of the toggles the search was handed, said before it starts."""
    given = result.start.toggles
    if not given:
        return
    how = (f"searching from the baseline: {result.start.describe()}, as given, is one candidate against it"
           if result.baseline is not result.start else f"searching from {result.start.describe()} as given")
    note = f"{how}; each of its toggles the winner keeps is tried switched off once the rest is settled"
    result.notes.append(note)
    if on_note is not None:
        on_note(note)


def _say_overrun(result: Search, space: SearchSpace, time_budget_s: float) -> None:
    """A search that ended past its budget says by how much, and what ran on (a compilation under way)."""
    over_s = result.elapsed_s - time_budget_s
    if over_s <= 0:
        return
    last = next((c.label for c in reversed(result.candidates) if not c.label.startswith(CROWNED)), "")
    why = f"{last}'s compilation, which cannot be stopped part-way, ran on" if last in space.uninterruptible else \
        "the run under way finished its step and its clean-up"
    result.notes.append(f"ended {over_s:.0f} s past the {time_budget_s:g} s budget: {why}")
    result.stopped = f"{result.stopped}; " if result.stopped else ""
    result.stopped += f"ended {over_s:.0f} s past the budget ({why})"


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


def _measured_already(c: Candidate, cfg, result: Search) -> bool:
    """The same configuration was measured against the same best (the toggles given, one of which is also a
    change of its own): its rounds decided once, and another look would only be a second chance (True: refused)."""
    key = config_key(cfg)
    earlier = next((s for s in result.standings if config_key(s.config) == key and s.steps and
                    _same(s.steps[:-1], result.steps)), None)
    if earlier is not None:
        c.reason = f"measured already against this best ({earlier.label}): {earlier.steps[-1].reason}"
    return earlier is not None


def _over_plan(c: Candidate, cfg, space: SearchSpace, budget_bytes) -> bool:
    """The planner's verdict, before any time is spent measuring (True: refused)."""
    if budget_bytes is None:
        return False
    planned = space.planned_peak(cfg)
    if planned is not None and planned > budget_bytes:
        c.reason = f"over budget by the planner: {planned / 2**20:.1f} MiB planned > {budget_bytes / 2**20:.1f} MiB"
        return True
    return False


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


# -- the final check -----------------------------------------------------------------------------------------
def _crown(result: Search, budget_bytes, on_candidate=None) -> None:
    """Check the best against every configuration measured that fits the budget, and crown one that is faster
    beyond noise (the fastest such), until none is; while the best does not fit, the fastest that does."""
    fitting = [s for s in result.standings if not _over_budget(s.peak_bytes, budget_bytes)]
    while fitting:
        current = _standing(result)
        if current is None:  # the best's own rounds were cut short: nothing measured to check against
            return
        if _over_budget(current.peak_bytes, budget_bytes):
            rival = max(fitting, key=lambda s: s.estimate)
            why = "the best does not fit the budget, and this is the fastest configuration measured that does"
        else:
            # beyond noise, and by the gain the search asks of any change (a 1% gain it refused is not
            # crowned through the back door)
            faster = [s for s in fitting if s is not current and verdict(_ratio(s, current), 1 + MIN_GAIN) == "faster"]
            if not faster:
                return
            rival = max(faster, key=lambda s: s.estimate)
            why = f"faster than the search's pick beyond noise and by more than {MIN_GAIN:.0%}"
        _crown_one(result, rival, current, why, on_candidate)


def _crown_one(result: Search, rival: Standing, current: Standing, why: str, on_candidate) -> None:
    iv = _ratio(rival, current)
    said = sentence(rival.label, iv, current.label) if iv else f"{rival.label} against {current.label}"
    row = Candidate(label=f"{CROWNED}{rival.label}", toggles=dict(rival.config.toggles),
                    batch_size=getattr(rival.config, "batch_size", None), accepted=True, interval=iv,
                    reason=f"{why}: {said}, through the rounds that link them", tokens_per_s=rival.tokens_per_s,
                    best_tokens_per_s=current.tokens_per_s, peak_bytes=rival.peak_bytes)
    result.best, result.steps = rival.config, rival.steps
    result.best_tokens_per_s, result.best_peak_bytes = rival.tokens_per_s, rival.peak_bytes
    result.candidates.append(row)
    if on_candidate is not None:
        on_candidate(row, result)


def _standing(result: Search) -> Standing | None:
    """The best's own standing (the latest measured, for a configuration measured more than once)."""
    key = config_key(result.best)
    return next((s for s in reversed(result.standings) if config_key(s.config) == key and _same(s.steps, result.steps)),
                None)


def _same(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


def _ratio(a: Standing, b: Standing) -> Interval | None:
    """`a`'s speed-up over `b`: the links of a's chain that b's lacks, multiplied, over b's that a's lacks
    (the links they share cancel; None: the same chain)."""
    shared = 0
    while shared < min(len(a.steps), len(b.steps)) and a.steps[shared] is b.steps[shared]:
        shared += 1
    links = [c.interval for c in a.steps[shared:]] + [_inverse(c.interval) for c in b.steps[shared:]]
    return product(links)


def _inverse(iv: Interval) -> Interval:
    """The interval of 1 / the ratio: the old over the new, measured in the same rounds."""
    return dataclasses.replace(iv, estimate=1 / iv.estimate, low=1 / iv.high, high=1 / iv.low)
