"""QAT against post-training quantization, on the same run: what each keeps of the fp32 model's quality.

Two trainings from the same start, seed and batches: one plain (fp32), one with the `qat` toggle on.  The
plain model is then quantized after training (PTQ); the QAT model is converted with the same base config.
Each is read on held-out text: its loss (and perplexity) and its top-1 agreement with the fp32 model (the share
of positions where its greedy next token is the fp32 model's, reading the same text).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math

import torch

from ..data.shakespeare import load_tokens
from ..distributed import runtime
from ..machine import hardware
from ..models import qat as qat_mod
from ..models.pretrained import heldout_loss
from .build import build, train_step
from .config import RunConfig


def trained(cfg: RunConfig, steps: int) -> torch.nn.Module:
    """The model of `cfg` after `steps` optimizer steps (unmeasured), on the device `cfg` chooses."""
    hw = hardware.detect(runtime.rank_device(cfg.device))
    cfg = cfg.resolve(hw)
    with contextlib.ExitStack() as stack:
        ctx = build(cfg, hw, stack)
        for _ in range(steps):
            train_step(ctx, next(ctx.batches))
        return ctx.base_model.eval()


@torch.no_grad()
def top1_agreement(model: torch.nn.Module, reference: torch.nn.Module, tokens, seq_len: int, windows: int) -> float:
    """Share of the held-out positions where `model`'s greedy next token is `reference`'s."""
    device = next(reference.parameters()).device
    data = torch.as_tensor(tokens[: windows * seq_len].astype("int64")).view(windows, seq_len).to(device)
    return (model(data)[0].argmax(-1) == reference(data)[0].argmax(-1)).float().mean().item()


def qat_vs_ptq(base: RunConfig, mode: str = "int4-weight", steps: int = 20, heldout: str = "new-plays-heldout",
               windows: int = 8) -> dict[str, dict[str, float]]:
    """{'fp32' | 'ptq' | 'qat': {'loss', 'perplexity', 'agreement'}} on `windows` held-out windows of `heldout`."""
    fp32 = trained(base, steps)
    ptq = copy.deepcopy(fp32)
    device_type = next(fp32.parameters()).device.type
    qat_mod.quantize(ptq, mode, device_type)
    toggles = {**base.toggles, "qat": mode} if isinstance(base.toggles, dict) else {**dict.fromkeys(base.toggles, True), "qat": mode}
    qat = trained(dataclasses.replace(base, toggles=toggles), steps)
    qat_mod.convert(qat, mode, device_type)
    tokens, seq_len = load_tokens(heldout), fp32.config.block_size if base.seq_len is None else base.seq_len
    out = {}
    for name, model in (("fp32", fp32), ("ptq", ptq), ("qat", qat)):
        loss = heldout_loss(model, tokens, seq_len, n_windows=windows)
        out[name] = {"loss": loss, "perplexity": math.exp(loss),
                     "agreement": top1_agreement(model, fp32, tokens, seq_len, windows)}
    return out
