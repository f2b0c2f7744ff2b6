"""The candidates refused before any time is spent measuring them, each with its reason: one that cannot run here,
cannot go with what is on, or is already on; one measured already against this best; one the planner says is
over the memory budget."""

from __future__ import annotations

from .space import Candidate, Search, SearchSpace, _same, config_key


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
