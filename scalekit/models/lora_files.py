"""Adapters on their own: save and load just the LoRA/DoRA weights, and merge them into the base.

An adapter file holds the adapter tensors and how they were made (rank, targets, DoRA or not): a fraction
of the model's size, written atomically, read back with `torch.load(weights_only=True)` (tensors and
plain containers only, no pickled code).  Merging folds B·A (scaled) into each base weight, so the merged
model is a plain model again with the adapted outputs; over a quantized base (QLoRA) the merge has to
re-quantize the sum, which is lossy: `merge_logit_difference` measures by how much.  `save_merged` writes the
merge of a Transformers model as a plain checkpoint folder (`from_pretrained` loads it, no peft and no
bitsandbytes needed): a quantized base is dequantized after the merge, so the folder's logits are the merged
model's.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from pathlib import Path

import torch

from ..errors import ConfigError
from ..files import check_writable, expand_user, write_atomic
from ..optional import quiet_import

FORMAT = "scalekit-adapters/1"


def _peft_model(model):
    peft = quiet_import("peft")
    if not isinstance(model, peft.PeftModel):
        raise ConfigError(f"adapters: expected a model with LoRA/DoRA adapters (a peft PeftModel, what the lora and "
                          f"dora toggles build), got {type(model).__name__}")
    return peft, model


def adapter_config(model) -> dict:
    """How the adapters were made, as plain data: rank, alpha, targets, DoRA."""
    _, model = _peft_model(model)
    c = model.peft_config["default"]
    return {"r": c.r, "lora_alpha": c.lora_alpha, "target_modules": sorted(c.target_modules),
            "use_dora": bool(c.use_dora)}


def adapter_state(model) -> dict[str, torch.Tensor]:
    peft, model = _peft_model(model)
    return {k: v.detach().cpu() for k, v in peft.get_peft_model_state_dict(model).items()}


def save(model, path: str | os.PathLike) -> int:
    """Write the adapters of `model` (only them) to `path`, atomically; returns the file's size in bytes."""
    doc = {"format": FORMAT, "config": adapter_config(model), "state": adapter_state(model)}
    path = write_atomic(check_writable(path, "adapter file"), lambda f: torch.save(doc, f), binary=True)
    return path.stat().st_size


def read(path: str | os.PathLike) -> dict:
    """The adapter file's contents, loaded with weights_only=True (no pickled objects)."""
    try:
        doc = torch.load(os.fspath(path), map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ConfigError(f"cannot read the adapter file {os.fspath(path)!r}: {type(exc).__name__}: "
                          f"{str(exc).splitlines()[0][:200] if str(exc) else ''}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ConfigError(f"{os.fspath(path)!r} is not a scalekit adapter file ({FORMAT})")
    return doc


def load(model, path: str | os.PathLike) -> None:
    """Put the adapters saved at `path` into `model`, which must carry adapters of the same shape."""
    peft, model = _peft_model(model)
    doc = read(path)
    if doc["config"] != adapter_config(model):
        raise ConfigError(f"the adapters in {os.fspath(path)!r} were made as {doc['config']}, but this model's are "
                          f"{adapter_config(model)}")
    result = peft.set_peft_model_state_dict(model, doc["state"])
    unexpected = getattr(result, "unexpected_keys", [])
    if unexpected:
        raise ConfigError(f"{os.fspath(path)!r} holds tensors this model has no place for: {unexpected[:3]}")


def merge(model) -> torch.nn.Module:
    """The base model with the adapters folded into its weights (peft's merge_and_unload)."""
    _, model = _peft_model(model)
    with warnings.catch_warnings():  # peft warns that merging into a 4-bit base rounds: measured, not hidden
        warnings.filterwarnings("ignore", message="Merge lora module to 4-bit linear")
        return model.merge_and_unload()


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "tokenizer.model", "vocab.json", "merges.txt")


def save_merged(model, folder: str | os.PathLike, tokenizer_from: str | os.PathLike | None = None) -> Path:
    """The adapters of a Transformers `model` merged into its base, saved as a plain checkpoint in `folder` (a
    quantized base dequantized: the folder holds the merged model's weights in full precision); the tokenizer's
    files copied from the checkpoint folder `tokenizer_from`.  Written beside `folder` and renamed into place."""
    target = expand_user(folder)
    if target.exists():
        raise ConfigError(f"save_merged: {target} exists; give a new folder")
    merged = merge(model)
    if not hasattr(merged, "save_pretrained"):
        raise ConfigError(f"save_merged: a merged checkpoint folder is written for a Transformers model; "
                          f"{type(merged).__name__} has no save_pretrained (save its state_dict instead)")
    if getattr(merged, "hf_quantizer", None) is not None or getattr(merged, "is_quantized", False):
        merged = merged.dequantize()
    swapped = sorted({type(m).__name__ for m in merged.modules() if type(m).__name__ in ("Linear4bit", "Linear8bitLt")})
    if swapped:
        raise ConfigError(f"save_merged: the base holds bitsandbytes layers ({', '.join(swapped)}) that transformers "
                          f"did not load, so it cannot dequantize them; a checkpoint folder as the model "
                          f"(RunConfig(model='PATH')) loads its base quantized the way it can")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        merged.save_pretrained(staging, safe_serialization=True)
        for name in TOKENIZER_FILES if tokenizer_from is not None else ():
            if (Path(tokenizer_from) / name).is_file():
                shutil.copy2(Path(tokenizer_from) / name, staging / name)
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


@torch.no_grad()
def merge_logit_difference(model, inputs: torch.Tensor) -> tuple[float, torch.nn.Module]:
    """The largest absolute logit difference between `model` (adapters unmerged) and its merge, on `inputs`;
    and the merged model.  Exact up to rounding for a float base; a quantized base re-quantizes (lossy)."""
    was_training = model.training
    model.eval()
    before = _logits(model(inputs))
    merged = merge(model)
    after = _logits(merged(inputs))
    merged.train(was_training)
    return (after.float() - before.float()).abs().max().item(), merged


def _logits(out) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)):
        return out[0]
    return out.logits  # a Hugging Face ModelOutput
