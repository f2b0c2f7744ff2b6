"""Save and load model weights under the names of the model you wrote.

torch.compile wraps a model in an OptimizedModule whose state_dict keys start with `_orig_mod.`; DDP and
FSDP wrappers add `module.`.  A checkpoint written from the wrapper will not load into a plain model.
`save` writes the innermost module's weights, atomically (temporary file, then rename), and `load` reads
them into any wrapping of the same model.
"""

from __future__ import annotations

import os

import torch

from ..errors import NotWritten, is_no_space, os_error_in, why_not_written
from ..files import check_writable, write_atomic

WRAPPER_ATTRS = ("_orig_mod", "module")  # torch.compile, DDP / DataParallel


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module you built, beneath compile and data-parallel wrappers."""
    while True:
        for attr in WRAPPER_ATTRS:
            inner = getattr(model, attr, None)
            if isinstance(inner, torch.nn.Module):
                model = inner
                break
        else:
            return model


def clean_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return unwrap(model).state_dict()


def save(model: torch.nn.Module, path: str | os.PathLike) -> None:
    """The innermost module's weights, written atomically (scalekit.files.write_atomic)."""
    state = clean_state_dict(model)
    target = check_writable(path, "checkpoint")
    try:
        write_atomic(target, lambda f: torch.save(state, f), binary=True)
    except (OSError, RuntimeError) as exc:
        err = os_error_in(exc)  # torch says a full disk as "[enforce fail at inline_container.cc]", raised from it
        if err is None and "inline_container" not in str(exc):
            raise  # not a failed write (a tensor torch cannot save): its own error says more
        error = NotWritten(f"checkpoint {str(target)!r} could not be written: {why_not_written(exc)}"
                           + ("; free some space there or save it elsewhere" if is_no_space(exc) else ""))
        error.errno = None if err is None else err.errno
        raise error from exc


def load(model: torch.nn.Module, path: str | os.PathLike, strict: bool = True):
    state = torch.load(os.fspath(path), map_location="cpu", weights_only=True)
    return unwrap(model).load_state_dict(state, strict=strict)
