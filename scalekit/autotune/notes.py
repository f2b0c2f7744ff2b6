"""What the search says beside its table (Search.notes, and `on_note` as it starts): before it starts, the
changes whose compilation cannot be stopped part-way and what becomes of the toggles it was handed; at its end,
by how much it ran past its time budget, and why."""

from __future__ import annotations

from .space import CROWNED, Search, SearchSpace


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
