"""Across the toggles: ORDER follows the phases and every toggle explains itself; a run with each of a set
of toggles still learns (each toggle's own checks are in its file, tests/toggles/test_<name>.py)."""

from __future__ import annotations

import pytest

from scalekit import run
from scalekit.toggles import ORDER, PHASES
from tests.helpers import learns, tiny

STEPS = dict(steps=30, warmup_steps=1, log_every=5)


def test_order_follows_phases_and_every_toggle_explains_itself():
    phases = [PHASES.index(t.phase) for t in ORDER]
    assert phases == sorted(phases)
    for t in ORDER:
        assert t.summary and t.cost and t.helps_when and t.group
        assert len(t.explainer) > len(t.summary), f"{t.name} has no explainer .md beside it"


@pytest.mark.parametrize("name", ["bf16", "fp16", "sdpa", "nice_numbers", "fused_adamw", "drop_last"])
def test_run_with_toggle_learns(name):
    result = run(tiny(toggles=[name], **STEPS))
    assert result.status == "ok"
    assert learns(result), result.losses


