"""fused_adamw: torch's fused AdamW kernel in place of the default one."""

from __future__ import annotations

from tests.helpers import built, tiny


def test_fused_adamw_makes_a_fused_optimizer():
    with built(tiny(toggles=["fused_adamw"])) as ctx:
        assert ctx.optimizer.defaults["fused"] is True
    with built(tiny()) as ctx:
        assert not ctx.optimizer.defaults.get("fused")
