"""What predict and plan_for are given, checked before anything is counted: the toggles (each known, each value one
its toggle takes), the degrees given as toggles, and the sizes (seq_len, batch_size)."""

from __future__ import annotations

from ..errors import ConfigError


def toggles_of(toggles) -> dict:
    if toggles is None:
        return {}
    if isinstance(toggles, str):
        toggles = [toggles]
    if isinstance(toggles, dict):
        return _checked(dict(toggles))
    out = {}
    for t in toggles:
        name, _, value = str(t).partition("=")
        out[name] = value or True
    return _checked(out)


# values predict takes beyond the toggles' own: torchtitan's op policy, and context parallelism's degree
PREDICT_ONLY = {"checkpointing": ("selective-torchtitan",), "context_parallel": None}


def _checked(toggles: dict) -> dict:
    """Each toggle known, each value one its toggle takes (as a run would refuse it), in a sentence naming both."""
    from ..toggles import TOGGLES

    for name, value in toggles.items():
        if name in PREDICT_ONLY and (PREDICT_ONLY[name] is None or value in PREDICT_ONLY[name]):
            continue
        if name not in TOGGLES:
            raise ConfigError(f"toggles: unknown toggle {name!r}; the known ones are {', '.join(sorted(TOGGLES))} and "
                              f"context_parallel")
        if name == "grad_accum":  # a degree: layout_of checks it (whole_degree)
            continue
        try:
            checked = TOGGLES[name].validate(value, "predict")
        except ConfigError as exc:  # "toggles['zero'] must be ...", which the command line says as --toggle
            raise ConfigError(str(exc).replace("predict.toggles[", "toggles[")) from None
        if name in ("tensor_parallel", "pipeline_parallel"):  # their spelled-out value: True is a degree, a schedule
            toggles[name] = checked
    return toggles


def as_number(value):
    """A value typed as text ('8') read as the whole number it spells; ASCII digits only (str.isdigit() also takes
    '²' and '٣', which int() then refuses or reads as 3).  Anything else is returned as it is."""
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    return value


def whole_degree(toggles: dict, name: str, when_true: int, what: str) -> int:
    """A degree given as a toggle's value: a whole number of at least 1 (an int, or ASCII digits from the command
    line), True for `when_true`, 1 when absent; anything else refused naming the toggle."""
    value = toggles.get(name, 1)
    if value is True:
        return when_true
    value = as_number(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"toggles[{name!r}] must be True or a whole number of at least 1 ({what}); got {value!r}")
    return value


# above the longest context any published model trains or serves (about 10M tokens), and far above any global
# batch in rows; a larger figure is a typo, and the counted model would not build (torch's sizes overflow)
MAX_SIZE = 2**24


def check_sizes(seq, batch) -> None:
    """seq_len and batch_size as whole numbers from 1 to MAX_SIZE; None (not given) passes."""
    for field_name, value in (("seq_len", seq), ("batch_size", batch)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SIZE:
            raise ConfigError(f"{field_name} must be a whole number from 1 to {MAX_SIZE:,} (tokens per row, rows in "
                              f"the global batch); got {value!r}")


def first_given(*values):
    """The first value that is not None (a 0 given stays 0, to be refused)."""
    return next(v for v in values if v is not None)
