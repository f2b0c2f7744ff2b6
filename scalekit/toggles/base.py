"""The Toggle interface and the build context toggles act on.

A toggle acts once, at its phase, on a freshly built run: "off" means building again without it, never
undoing it (torch.compile and FSDP cannot be undone).  The order in which phases run, and toggles within
a phase, is fixed in one place: `scalekit.toggles.apply_toggles`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigError

# Phases, in the order the engine runs them (see scalekit.toggles.apply_toggles for why).
PHASES = ("process", "data", "model_config", "wrap", "optimizer", "step")
KINDS = ("runtime", "memory", "both")


@dataclass
class BuildContext:
    """What toggles read and change while a run is being built."""

    config: Any  # the resolved RunConfig
    hw: Any  # scalekit.hardware.Hardware
    device: torch.device
    stack: contextlib.ExitStack  # process-wide changes register their undo here
    gpt_config: Any = None  # GPTConfig before the model is built (None for a user's own model)
    model: torch.nn.Module | None = None
    loader_kwargs: dict = field(default_factory=dict)
    optimizer_kwargs: dict = field(default_factory=dict)
    autocast_dtype: torch.dtype | None = None
    grad_scaler: Any = None  # torch.amp.GradScaler when fp16 is on
    grad_accum_steps: int = 1  # micro-batches per optimizer step (the batch is split along dim 0)
    no_sync: Any = None  # model.no_sync-like: a context for micro-steps that must not all-reduce
    optimizer_factory: Any = None  # params -> Optimizer; None: torch AdamW with optimizer_kwargs
    after_step: list = field(default_factory=list)  # callables(step_index) run after each optimizer step
    notes: list[str] = field(default_factory=list)


class Toggle:
    """One optimization.  Subclasses set the class attributes and implement `apply`."""

    name: str = ""
    summary: str = ""  # one line: what it does
    cost: str = ""  # one line: what it costs
    helps_when: str = ""  # one line: when it helps
    group: str = ""  # course grouping for the Lab panel
    kind: str = "runtime"  # one of KINDS
    phase: str = ""  # one of PHASES
    choices: tuple | None = None  # None: on/off; else the allowed modes, the first being the default
    gpt_only: bool = False  # needs the built-in GPT (changes its architecture or data)

    def available(self, hw) -> tuple[bool, str]:
        """(True, "") or (False, the reason in plain words)."""
        return True, ""

    def available_in_ranks(self, hw) -> tuple[bool, str]:
        """What `available` would answer in each rank of a multi-process launch (the Lab and CLI launch
        toggles that need several processes); the same answer for toggles that do not."""
        return self.available(hw)

    def validate(self, value: Any) -> Any:
        """Normalise a user's value (True, or one of `choices`); raise ConfigError naming the allowed values."""
        if self.choices is None:
            if value is True:
                return True
            raise ConfigError(f"RunConfig.toggles[{self.name!r}] is an on/off toggle: use True, got {value!r}")
        if value is True:
            return self.choices[0]
        if value in self.choices:
            return value
        allowed = ", ".join(repr(c) for c in self.choices)
        raise ConfigError(f"RunConfig.toggles[{self.name!r}] must be True or one of {allowed}; got {value!r}")

    def apply(self, ctx: BuildContext, value: Any) -> None:
        raise NotImplementedError

    @property
    def explainer(self) -> str:
        """The longer explanation kept beside the toggle's module as <name>.md."""
        path = Path(__file__).with_name(f"{self.name}.md")
        return path.read_text(encoding="utf-8") if path.exists() else self.summary

    def __repr__(self) -> str:
        return f"<Toggle {self.name}: {self.summary}>"
