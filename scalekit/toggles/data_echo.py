"""data_echo: use each batch the input pipeline delivers for k optimizer steps before fetching the next."""

from __future__ import annotations

from collections.abc import Iterator

from .base import BuildContext, Spelling
from .counted import CountToggle


class DataEcho(CountToggle):
    name = "data_echo"
    summary = "data echoing: each fetched batch is used for k optimizer steps before the next is fetched"
    cost = "k× fewer fresh samples per step: a repeated batch teaches less than a new one (more steps to a loss)"
    helps_when = "the input pipeline is slower than the step and cannot be made faster (Choi et al., 2019)"
    group = "data"
    phase = "data"
    default = 2
    choices = (2, 4, 8)  # offered in the Lab and `scalekit toggles`; any count works
    unit = "optimizer steps per fetched batch"
    plan_note = "data_echo repeats batches; a step's memory is the same"

    def changes_nothing(self, cfg) -> str | None:
        if cfg.toggles.get(self.name) == 1:
            return "data_echo=1 changes nothing: each fetched batch is used once, as without it"
        return None

    def apply(self, ctx: BuildContext, k: int) -> None:
        # batch echoing, after the device copy: the echoed steps neither fetch nor copy again
        ctx.batch_wrappers.append(lambda batches: echo_batches(batches, k))

    # Framework spellings: Trainer arguments, accelerate, Lightning
    def spelling(self, target, value, cfg) -> Spelling:
        return Spelling(missing="no framework has a switch to use each fetched batch for k steps (it would be a "
                                "wrapper around your DataLoader)")


def echo_batches(batches: Iterator, k: int) -> Iterator:
    """Every batch of `batches`, k times in a row: the pipeline upstream is asked 1/k as often."""
    for batch in batches:
        for _ in range(k):
            yield batch


TOGGLE = DataEcho()
