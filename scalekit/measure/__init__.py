from .flops import counted_train_flops, gpt_train_flops_per_token, mfu
from .memory import LiveTensorBytes, storage_bytes
from .results import RunResult, StepRecord, compare
from .timing import Spread, step_timer

__all__ = ["LiveTensorBytes", "RunResult", "Spread", "StepRecord", "compare", "counted_train_flops",
           "gpt_train_flops_per_token", "mfu", "step_timer", "storage_bytes"]
