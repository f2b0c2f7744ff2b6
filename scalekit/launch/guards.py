"""Checks made before forking ranks from this process, each with a message that says what to do.

Forking copies the whole process.  A child of a process that has already created a CUDA context cannot
use CUDA ("Cannot re-initialize CUDA in forked subprocess"), bitsandbytes sets up device state when it is
imported, and a live process group would hand its sockets to every child.  So scalekit refuses early,
in plain words, instead of letting the ranks hang or crash (accelerate's notebook_launcher does the same).
"""

from __future__ import annotations

import os
import sys

from ..errors import ForkUnsafeError
from ..machine import hardware

MAGIC = ("or run the cell with the %%torchrun magic (`%load_ext scalekit`), which starts fresh interpreters "
         "instead of forking")


def fork_problems() -> list[str]:
    """Why forking ranks from this process would fail, in words a user can act on ([] when it is safe)."""
    problems = []
    if not hasattr(os, "fork"):
        problems.append("this platform has no fork(): use the %%torchrun cell magic or `scalekit launch`")
    if hardware.cuda_initialized():
        problems.append("CUDA is already initialised in this process (a CUDA tensor, a torch.cuda call or a "
                        "model moved to the GPU), and forked children cannot use CUDA after that: restart the "
                        "kernel and keep every CUDA call inside the launched function, " + MAGIC)
    if "bitsandbytes" in sys.modules:
        problems.append("bitsandbytes is already imported in this process, and its import sets up device "
                        "state that forked children cannot share: restart the kernel and move `import "
                        "bitsandbytes` (and imports that pull it in, such as quantized transformers/peft "
                        "models) inside the launched function, " + MAGIC)
    if _process_group_alive():
        problems.append("a torch.distributed process group is already alive in this process; forked ranks "
                        "would inherit its sockets.  Call torch.distributed.destroy_process_group() first "
                        "(or restart the kernel)")
    if os.environ.get("SCALEKIT_LAUNCHED_RANK") is not None:
        problems.append("this process is already a launched rank: launch from the notebook (or script) "
                        "process, not from inside a launched function")
    return problems


def check_fork_safe() -> None:
    """Raise ForkUnsafeError listing every problem found, or return if forking ranks is safe."""
    problems = fork_problems()
    if problems:
        lines = "\n".join(f"  - {p}" for p in problems)
        raise ForkUnsafeError(f"scalekit.launch cannot fork ranks from this process:\n{lines}")


def _process_group_alive() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def default_nprocs() -> int:
    """One rank per GPU (counted without creating a CUDA context), or 2 ranks on a CPU-only machine."""
    return hardware.gpu_count_without_cuda_init() or 2
