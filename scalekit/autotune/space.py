"""What the search works with and what it records: the space it is handed (SearchSpace: the changes, and how
the machine is asked about them, injected so tests can script it; Measurement: one measured run), each change tried
(Candidate), each configuration measured with the chain of paired rounds that links it to the baseline (Standing),
and the outcome (Search).  `config_key` is a configuration's identity in a search."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..measure.stats import Interval, product

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


def config_key(cfg) -> tuple:
    """One configuration's identity in a search: its toggles and batch."""
    return tuple(sorted((k, str(v)) for k, v in cfg.toggles.items())), getattr(cfg, "batch_size", None)


def _same(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))
