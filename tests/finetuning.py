"""The shipped model set up for fine-tuning, as the fine-tuning tests build it
(tests/training/test_finetune.py and the fine-tuning toggles' files in tests/toggles)."""

from __future__ import annotations

import contextlib

from scalekit import RunConfig
from scalekit.models.blocks import block_linears
from scalekit.training.build import build
from scalekit.training.finetune import finetune_config
from tests.helpers import CPU

SMALL = dict(seq_len=64, batch_size=8, device="cpu")


def ft(toggles=None, **kw) -> RunConfig:
    return finetune_config(toggles=toggles or {}, **{**SMALL, **kw})


@contextlib.contextmanager
def built(cfg: RunConfig):
    with contextlib.ExitStack() as stack:
        yield build(cfg.resolve(CPU), CPU, stack)


def lora_formula(model, rank: int, names=None) -> int:
    """r·(in + out) per adapted linear layer."""
    return sum(rank * (m.in_features + m.out_features)
               for m in (model.get_submodule(n) for n in block_linears(model, names)))
