"""Importing the optional heavy libraries (peft, torchao, hqq, bitsandbytes) where a toggle needs them, quietly.

They print messages at import about kernels they cannot load here (torchao's GPU extensions on a CPU machine,
bitsandbytes' optional `kernels` package) and make torch log deprecation notes about their enums: none of it
concerns the user.  A leaf module: it imports nothing of scalekit.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
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


@contextlib.contextmanager
def hub_offline():
    """Hugging Face Hub calls made inside this block stay offline (huggingface_hub's own offline switch, set and put
    back).  bitsandbytes, when the `kernels` package is installed (transformers requires it), asks the Hub at import
    for an optional CPU kernel: publisher checks and a download, at the import of anything that pulls it in
    (peft, transformers' Trainer).  scalekit never reaches the network, so its imports run inside this block:
    the kernel is used where it is already in the local cache, bitsandbytes' own CPU code otherwise."""
    if importlib.util.find_spec("huggingface_hub") is None:
        yield
        return
    from huggingface_hub import constants

    before = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = before


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
                warnings.catch_warnings(), hub_offline():
            warnings.simplefilter("ignore")
            return importlib.import_module(module)
    finally:
        pytree_log.setLevel(level)
