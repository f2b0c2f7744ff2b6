"""Toggles whose value is a count: micro-batches per step, steps between cache releases, blocks per checkpoint."""

from __future__ import annotations

import numbers
from typing import Any

from ..errors import ConfigError
from .base import Toggle


def as_count(value: Any) -> int | None:
    """A positive whole number from an int or a numeric string (the CLI passes NAME=VALUE as text), else None."""
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():  # not '²' (int() refuses it)
        value = int(value.strip())
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 1:
        return int(value)
    return None


class CountToggle(Toggle):
    """A toggle set to a positive whole number; True means `default`.  Its `choices` are the counts offered
    in menus: `validate` accepts any count, not only those."""

    default: int = 1
    unit: str = ""  # what is counted, for error messages

    def validate(self, value: Any, owner: str = "RunConfig") -> int:
        if value is True:
            return self.default
        count = as_count(value)
        if count is None:
            raise ConfigError(f"{owner}.toggles[{self.name!r}] must be True (= {self.default}) or a positive "
                              f"whole number of {self.unit}; got {value!r}")
        return count
