"""Importing the optional heavy libraries (peft, torchao, hqq, bitsandbytes) where a toggle needs them, quietly.

They print messages at import about kernels they cannot load here (torchao's GPU extensions on a CPU machine,
bitsandbytes' optional `kernels` package) and make torch log deprecation notes about their enums: none of it
concerns the user.  A leaf module: it imports nothing of scalekit.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import logging
import os
import warnings

# Warnings libraries give about their own internals, harmless to a run and not for the user to act on: each
# (message pattern, category, why it is harmless), silenced for the process once the library is in use.
KNOWN_WARNINGS = {
    "torchao": [(r".*does not implement _stable_hash_for_caching", UserWarning,
                 "torch asks torchao's tensor subclasses for a hash to key its compile cache by; without one the "
                 "cache is keyed less stably, the compiled code is the same")],
}


def silence_known_warnings(library: str) -> None:
    """Filter `library`'s KNOWN_WARNINGS (narrow filters, each added once)."""
    for pattern, category, _ in KNOWN_WARNINGS.get(library, ()):
        if not any(f[0] == "ignore" and getattr(f[1], "pattern", None) == pattern for f in warnings.filters):
            warnings.filterwarnings("ignore", message=pattern, category=category)


def quiet_import(module: str, device_type: str | None = None):
    """`importlib.import_module(module)` with its import-time messages kept out of the user's output.
    device_type 'cpu' (None: 'cpu' when torch sees no CUDA GPU) also skips loading torchao's GPU extensions,
    which peft and transformers import too."""
    if device_type is None:
        import torch

        device_type = "cuda" if torch.cuda.is_available() else "cpu"
    if device_type == "cpu":
        os.environ.setdefault("TORCHAO_FORCE_SKIP_LOADING_SO_FILES", "1")
    pytree_log = logging.getLogger("torch.utils._pytree")  # torchao registers an enum torch warns about
    level = pytree_log.level
    pytree_log.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
                warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return importlib.import_module(module)
    finally:
        pytree_log.setLevel(level)
