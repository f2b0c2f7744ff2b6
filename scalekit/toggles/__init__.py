"""Every optimization scalekit can switch, and the one function that fixes the order they apply in."""

from __future__ import annotations

from . import bf16, compile, drop_last, fp16, fused_adamw, nice_numbers, sdpa, tf32
from .base import PHASES, BuildContext, Toggle

# Application order (after torchtitan): process-wide flags first; then the data pipeline; then changes to
# the model's architecture, made before it is built; then wrappers, innermost first (activation
# checkpointing, then compile, then DDP/FSDP, so the wrapper that shards sees compiled blocks); then the
# optimizer, which must see the final parameters; last the per-step contexts (autocast, loss scaling),
# entered around every step.
ORDER: tuple[Toggle, ...] = (
    tf32.TOGGLE,
    drop_last.TOGGLE,
    sdpa.TOGGLE,
    nice_numbers.TOGGLE,
    compile.TOGGLE,
    fused_adamw.TOGGLE,
    bf16.TOGGLE,
    fp16.TOGGLE,
)
TOGGLES: dict[str, Toggle] = {t.name: t for t in ORDER}

# Toggles that cannot be on together, and why.
EXCLUSIVE: tuple[tuple[str, str, str], ...] = (
    ("bf16", "fp16", "both set the autocast dtype: pick one"),
)


def apply_toggles(ctx: BuildContext, phase: str, toggles: dict) -> None:
    """Apply the chosen `toggles` that act at `phase`, in ORDER."""
    assert phase in PHASES, phase
    for toggle in ORDER:
        if toggle.phase == phase and toggle.name in toggles:
            toggle.apply(ctx, toggles[toggle.name])


__all__ = ["ORDER", "TOGGLES", "EXCLUSIVE", "apply_toggles", "Toggle", "BuildContext", "PHASES"]
