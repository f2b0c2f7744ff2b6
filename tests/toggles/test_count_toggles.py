"""The toggles that take a count (grad_accum, empty_cache_steps, checkpointing): whole numbers and numeric
strings accepted, anything else refused naming the field."""

from __future__ import annotations

import pytest

from scalekit import ConfigError, RunConfig
from scalekit.toggles import TOGGLES


@pytest.mark.parametrize("name,value,expected", [
    ("grad_accum", True, 4), ("grad_accum", 2, 2), ("grad_accum", "8", 8),
    ("empty_cache_steps", True, 1), ("empty_cache_steps", "10", 10),
    ("checkpointing", True, 1), ("checkpointing", 3, 3), ("checkpointing", "2", 2),
    ("checkpointing", "sequential", "sequential"),
])
def test_count_toggles_accept_whole_numbers_and_numeric_strings(name, value, expected):
    assert TOGGLES[name].validate(value) == expected


@pytest.mark.parametrize("name", ["grad_accum", "empty_cache_steps", "checkpointing"])
@pytest.mark.parametrize("bad", [0, -2, 2.5, "four", "0"])
def test_count_toggles_refuse_other_values_naming_the_field(name, bad):
    with pytest.raises(ConfigError, match=rf"toggles\['{name}'\].*positive whole number"):
        RunConfig(toggles={name: bad})
