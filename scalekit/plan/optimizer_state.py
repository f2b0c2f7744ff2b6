"""Optimizer-state bytes after the first step, from the parameters' shapes alone (no optimizer is built)."""

from __future__ import annotations

import math
from collections.abc import Collection

from ..toggles.optim import EIGHT_BIT
from .estimate import FP32

BNB_MIN_8BIT_SIZE = 4096  # bitsandbytes quantizes tensors of at least this many values (min_8bit_size)
BNB_BLOCK = 256  # values per fp32 absmax in bitsandbytes' block-wise quantization


def optimizer_state_bytes(optim: str, shapes: list[tuple[int, ...]], keep_32bit: Collection[int] = (),
                          matrices: Collection[int] = ()) -> int:
    """State bytes after the first step for parameters of `shapes`; 8-bit optimizers keep the parameters at
    the indices `keep_32bit` (token embeddings) in 32-bit state; Muon takes those at `matrices` (the blocks'
    2-D weights), AdamW the rest."""
    total = 0
    quantized = False
    for i, shape in enumerate(shapes):
        n = math.prod(shape)
        if optim == "muon" and i in matrices:  # one fp32 momentum buffer, no step counter
            total += n * FP32
        elif optim == "adafactor":  # a step counter; a row and a column for a matrix, else a full variance
            total += FP32 + (sum(shape) if len(shape) == 2 else n) * FP32
        elif optim in EIGHT_BIT:
            moments = 1 if optim == "lion_8bit" else 2
            if n < BNB_MIN_8BIT_SIZE or i in keep_32bit:
                total += moments * n * FP32
            else:  # one uint8 per value and an fp32 absmax per block, per moment
                total += moments * (n + math.ceil(n / BNB_BLOCK) * FP32)
                quantized = True
        else:  # torch AdamW: exp_avg, exp_avg_sq and a step-counter tensor
            total += 2 * n * FP32 + FP32
    if quantized:  # one shared 256-entry fp32 code book per moment
        total += (1 if optim == "lion_8bit" else 2) * 256 * FP32
    return total
