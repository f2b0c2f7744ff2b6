"""The GPT shipped inside scalekit: a small character-level model trained on the shipped corpus.

A model worth generating from, for the inference, quantization and fine-tuning material.  Its weights
(`weights/shakespeare_char.pt`, a plain fp32 state_dict) load with `torch.load(weights_only=True)`, which
refuses any pickled object that is not a tensor or a plain container; its provenance (shape, tokenizer,
training schedule, seed, held-out loss and how it was measured) sits beside it in a `.json`.  The script
that reproduces both is `scripts/train_shipped_model.py` in the repository.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from importlib import resources

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import ConfigError
from .gpt import GPT, GPTConfig

WEIGHTS_DIR = resources.files("scalekit.models").joinpath("weights")
# public name -> file stem in WEIGHTS_DIR; the draft is the same recipe at a fraction of the size, for
# speculative decoding beside the shipped model (same tokenizer)
PRETRAINED = {"shakespeare-char": "shakespeare_char", "shakespeare-char-draft": "shakespeare_char_draft"}
PRETRAINED_NAMES = tuple(PRETRAINED)


def _files(name: str):
    if name not in PRETRAINED:
        raise ConfigError(f"unknown pretrained model {name!r}; allowed: {', '.join(PRETRAINED_NAMES)}")
    stem = PRETRAINED[name]
    return WEIGHTS_DIR.joinpath(f"{stem}.pt"), WEIGHTS_DIR.joinpath(f"{stem}.json")


def pretrained_info(name: str = "shakespeare-char") -> dict:
    """The provenance of a shipped model: its GPTConfig, tokenizer, training schedule and held-out loss."""
    _, info_path = _files(name)
    try:
        return json.loads(info_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise RuntimeError(f"cannot read the provenance file {info_path}: {type(exc).__name__}: "
                           f"{str(exc).splitlines()[0] if str(exc) else ''}") from None


def load_pretrained(name: str = "shakespeare-char", device: str | torch.device = "cpu") -> GPT:
    """The shipped GPT `name`, built from its recorded config, weights loaded with weights_only=True, in
    eval mode on `device`."""
    weights_path, _ = _files(name)
    info = pretrained_info(name)
    model = GPT(GPTConfig(**info["config"]))
    try:
        with weights_path.open("rb") as f:
            state = torch.load(f, map_location="cpu", weights_only=True)
        model.load_state_dict(state)
    except Exception as exc:  # missing, truncated, tampered (a pickled object) or of another shape
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise RuntimeError(f"cannot load the pretrained weights {weights_path}: {type(exc).__name__}: "
                           f"{first[:200]} (scripts/train_shipped_model.py reproduces them)") from None
    return model.to(device).eval()


def state_dict_sha256(state: dict[str, torch.Tensor]) -> str:
    """A digest of the tensors' names, shapes, dtypes and bytes: equal digests mean identical weights."""
    h = hashlib.sha256()
    for key in sorted(state):
        t = state[key].detach().cpu().contiguous()
        h.update(f"{key}:{tuple(t.shape)}:{t.dtype};".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


@torch.no_grad()
def position_losses(model: torch.nn.Module, tokens, seq_len: int, n_windows: int | None = None,
                    batch_size: int = 8) -> tuple[torch.Tensor, int]:
    """Cross-entropy summed over windows at each of the seq_len positions (float64), and the window count.

    The windows are the first `n_windows` consecutive, non-overlapping ones of `tokens` (all that fit when
    None): window k reads tokens[kT : kT+T] and predicts tokens[kT+1 : kT+T+1].  Eval mode, no grad; the
    model's mode is restored afterwards."""
    data = torch.from_numpy(np.asarray(tokens).astype(np.int64))
    fit = (len(data) - 1) // seq_len
    n = fit if n_windows is None else n_windows
    if not 0 < n <= fit:
        raise ValueError(f"{len(data)} tokens hold {fit} windows of {seq_len}; {n_windows} were asked for")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    sums = torch.zeros(seq_len, dtype=torch.float64)
    for first in range(0, n, batch_size):
        starts = range(first * seq_len, min(n, first + batch_size) * seq_len, seq_len)
        x = torch.stack([data[s: s + seq_len] for s in starts]).to(device)
        y = torch.stack([data[s + 1: s + seq_len + 1] for s in starts]).to(device)
        logits = model(x)[0].float()
        loss = F.cross_entropy(logits.transpose(1, 2), y, reduction="none")  # (B, T)
        sums += loss.double().sum(0).cpu()
    model.train(was_training)
    return sums, n


def heldout_loss(model: torch.nn.Module, tokens, seq_len: int, n_windows: int | None = None,
                 batch_size: int = 8) -> float:
    """Mean cross-entropy in nats per token over every predicted token of the windows position_losses reads."""
    sums, n = position_losses(model, tokens, seq_len, n_windows, batch_size)
    return sums.sum().item() / (n * seq_len)


def heldout_loss_by_part(model: torch.nn.Module, tokens, seq_len: int, n_windows: int | None = None,
                         parts: int = 4) -> list[float]:
    """The same mean over each of `parts` equal ranges of positions: does the model use its whole context?"""
    sums, n = position_losses(model, tokens, seq_len, n_windows)
    return [chunk.sum().item() / (n * chunk.numel()) for chunk in sums.chunk(parts)]


def config_fields(cfg: GPTConfig) -> dict:
    """GPTConfig as the JSON provenance stores it (GPT(GPTConfig(**fields)) rebuilds the model)."""
    return dataclasses.asdict(cfg)
