"""The search's time: the Deadline that stops a measurement under way at the time budget (or when the caller's
stop flag is set), and the Budget that starts a run only when what such runs have cost on this machine so far
says it will end inside the budget."""

from __future__ import annotations

import time
from typing import Any

from .space import Measurement, SearchSpace, config_key

DEADLINE_MARGIN = 0.05  # a measurement under way is stopped this share of the time budget before its end


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
