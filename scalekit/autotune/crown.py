"""The final check: the winner against every configuration measured that fits the memory budget.  Two
configurations compare through the links of paired intervals their chains to the baseline do not share, multiplied
(`_ratio`); one faster than the winner beyond noise and by more than MIN_GAIN is crowned instead (or, while the
winner does not fit, the fastest that does), and the table gains a row saying so."""

from __future__ import annotations

import dataclasses

from ..measure.stats import Interval, product, sentence, verdict
from .paired import MIN_GAIN, _over_budget
from .space import CROWNED, Candidate, Search, Standing, _same, config_key


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
