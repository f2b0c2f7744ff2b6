"""The changes autotune tries, as the toggles declare them (Toggle.tuning): nothing here names a toggle."""

from __future__ import annotations

from ..toggles import ORDER, TOGGLES, Tune


def declared_changes(loop: str, hw, applies=None) -> list[tuple[str, dict, Tune]]:
    """(label, toggles to set, its Tune) for every change the toggles declare for `loop`, in their rank order.

    A Tune with `instead_of` is left out where that toggle is available; one whose value is a tuple of modes
    becomes the first of them that runs here (or the first, which the search then reports as unavailable);
    `applies(toggle)` (optional) leaves out toggles that do not apply to the model."""
    found = []
    for toggle in ORDER:
        if applies is not None and not applies(toggle):
            continue
        for tune in toggle.tuning:
            if tune.loop != loop:
                continue
            if tune.instead_of and _available(tune.instead_of, hw):
                continue
            value = _first_that_runs(toggle, tune.value, hw) if isinstance(tune.value, tuple) else tune.value
            label = tune.label or (toggle.name if value is True or value == "default" else f"{toggle.name}={value}")
            if isinstance(tune.value, tuple):
                label = f"{label} ({value})"
            found.append((tune.rank, label, {toggle.name: value}, tune))
    found.sort(key=lambda row: row[0])  # stable: equal ranks keep ORDER
    return [(label, toggles, tune) for _, label, toggles, tune in found]


def _available(name: str, hw) -> bool:
    return name in TOGGLES and TOGGLES[name].available(hw)[0]


def _first_that_runs(toggle, values: tuple, hw):
    for value in values:
        if toggle.choice_available(hw, value)[0]:
            return value
    return values[0]
