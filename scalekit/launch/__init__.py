"""Several processes from a notebook cell, on torch.distributed.elastic (the engine behind torchrun).

- `launch(fn, *args, nprocs=N)`: fork N ranks that run fn; their output streams into the cell.  A failure
  is reported by the rank that failed first; `timeout_s=` stops ranks that hang and names them; the ranks'
  logs are removed when the launch ends, unless `keep_logs=True`.
- `launch_run(config, nprocs=N)`: scalekit.run(config) over N ranks, aggregated (ddp, fsdp, cpu_offload).
- `%load_ext scalekit` then `%%torchrun --nproc-per-node N`: the cell as a script under torchrun, for
  when forking is not safe (CUDA already initialised, bitsandbytes imported).
- `scalekit launch ...` on the command line, one node or several; `torchrun_command` prints the exact
  torchrun line for a script or a RunConfig.
"""

import os
import sys

# torch.cuda.is_available() normally initialises the CUDA driver, after which forked ranks cannot use
# CUDA; asking NVML instead keeps the notebook process safe to fork (torch documents this switch).
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")

from .api import launch, launch_run, launch_script  # noqa: E402
from .commands import torchrun_command  # noqa: E402
from .failure_report import LaunchError  # noqa: E402
from .guards import ForkUnsafeError, check_fork_safe, fork_problems  # noqa: E402

__all__ = ["launch", "launch_run", "launch_script", "LaunchError", "ForkUnsafeError", "check_fork_safe",
           "fork_problems", "torchrun_command"]


class _CallableModule(sys.modules[__name__].__class__):
    """`scalekit.launch(fn, ...)` calls `launch`, while `scalekit.launch.<module>` stays this package."""

    def __call__(self, fn, *args, **kwargs):
        return launch(fn, *args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
