"""Save and load model weights under the names of the model you wrote.

torch.compile wraps a model in an OptimizedModule whose state_dict keys start with `_orig_mod.`; DDP and
FSDP wrappers add `module.`.  A checkpoint written from the wrapper will not load into a plain model.
`save` writes the innermost module's weights, atomically (temporary file, then rename), and `load` reads
them into any wrapping of the same model.
"""

from __future__ import annotations

import os

import torch

from .files import check_writable, write_atomic

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
    write_atomic(check_writable(path, "checkpoint"), lambda f: torch.save(state, f), binary=True)


def load(model: torch.nn.Module, path: str | os.PathLike, strict: bool = True):
    state = torch.load(os.fspath(path), map_location="cpu", weights_only=True)
    return unwrap(model).load_state_dict(state, strict=strict)
