"""Measuring honestly: step timing and its spread, memory, FLOPs and MFU, the statistics of a speed-up's
interval, the machine's load while it ran, and what training's and generation's results share."""

from .flops import counted_train_flops, gpt_train_flops_per_token, mfu
from .memory import LiveTensorBytes, storage_bytes
from .timing import Spread, step_timer

__all__ = ["LiveTensorBytes", "Spread", "counted_train_flops", "gpt_train_flops_per_token", "mfu", "step_timer",
           "storage_bytes"]
