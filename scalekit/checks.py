"""The checks RunConfig and GenerateConfig share, each error naming the config and the field (a leaf module)."""

from __future__ import annotations

import numbers
from typing import Any

from .errors import ConfigError

# RunConfig's ranges that the TrainingArguments reader (scalekit.hf.arguments) checks too, naming its own fields
LR_RANGE = (1e-8, 1.0)
BATCH_SIZE_RANGE = (1, 2**24)
SEED_RANGE = (0, 2**63 - 1)


def int_in(owner: str, name: str, value: Any, low: int, high: int) -> int:
    """`value` if it is a whole number from `low` to `high` (not a bool), else ConfigError naming owner.name."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not low <= value <= high:
        kind = "a positive integer" if low == 1 else ("an integer >= 0" if high < 2**62 else "an integer")
        raise ConfigError(f"{owner}.{name} must be {kind} from {low} to {high:,}, got {value!r}")
    return int(value)


def check_bool(owner: str, name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"{owner}.{name} must be True or False, got {value!r}")


def ascii_digits(text: str) -> bool:
    """0-9 only: str.isdigit() also takes '²' and '٣', which int() then refuses or reads as another number."""
    return bool(text) and text.isascii() and text.isdigit()


def bool_or_none(owner: str, name: str, value: Any) -> bool | None:
    """`value` if it is True, False or None, else ConfigError naming owner.name."""
    if value is not None and not isinstance(value, bool):
        raise ConfigError(f"{owner}.{name} must be True, False or None, got {value!r}")
    return value


def real_in(owner: str, name: str, value: Any, low: float, high: float) -> float:
    """`value` as a float if it is a number from `low` to `high` (not a bool, not NaN), else ConfigError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not low <= value <= high:
        raise ConfigError(f"{owner}.{name} must be a number from {low:g} to {high:g}, got {value!r}")
    return float(value)


def one_of(owner: str, name: str, value: Any, allowed: tuple) -> Any:
    """`value` if it is one of `allowed` (compared by equality, of the same type), else ConfigError listing them."""
    if not any(type(value) is type(a) and value == a for a in allowed):
        raise ConfigError(f"{owner}.{name} must be one of {', '.join(repr(a) for a in allowed)}; got {value!r}")
    return value


def dict_or_none(owner: str, name: str, value: Any) -> dict:
    """A copy of `value` if it is a dict with string keys, {} for None, else ConfigError."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ConfigError(f"{owner}.{name} must be a dict (of option names) or None, got {value!r}")
    return dict(value)


def check_device(owner: str, device: Any) -> None:
    if not isinstance(device, str) or not (device in ("auto", "cpu", "cuda")
                                           or (device.startswith("cuda:") and ascii_digits(device[5:]))):
        raise ConfigError(f"{owner}.device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}")


def check_label(owner: str, label: Any) -> None:
    if label is not None and (not isinstance(label, str) or not label.strip() or len(label) > 200
                              or not label.isprintable()):
        raise ConfigError(f"{owner}.label must be None or a printable name of 1 to 200 characters, got {label!r}")


MAX_THREADS = 4096


def check_threads(owner: str, threads: Any) -> None:
    """None (the cores not already busy) or a whole number of intra-op threads."""
    if threads is not None:
        int_in(owner, "threads", threads, 1, MAX_THREADS)


def micro_batch_rows(batch_size: int, ranks: int = 1, micro_batches: int = 1) -> int:
    """The rows of one micro-batch on one rank: batch_size / ranks / micro_batches, refused (ConfigError) where
    the batch does not split evenly (every rank, planner and exporter asks this one question)."""
    if batch_size % ranks:
        raise ConfigError(f"RunConfig.batch_size ({batch_size}) must be divisible by the number of ranks "
                          f"({ranks}): each rank trains on batch_size / ranks sequences")
    per_rank = batch_size // ranks
    if per_rank % micro_batches:
        what = f"batch_size / ranks ({per_rank})" if ranks > 1 else f"batch_size={batch_size}"
        allowed = ", ".join(str(d) for d in range(1, per_rank + 1) if per_rank % d == 0)
        raise ConfigError(f"RunConfig.toggles['grad_accum']={micro_batches} must divide {what} (each micro-batch is "
                          f"batch_size/k sequences); allowed here: {allowed}")
    return per_rank // micro_batches
