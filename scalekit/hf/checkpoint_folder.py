"""A Transformers checkpoint folder on disk, as `save_pretrained` writes it: config.json, the weights
(model.safetensors, sharded with an index, or pytorch_model.bin) and, beside them, the tokenizer's files.

`checkpoint_problem(path)` says, before anything is loaded, what makes a folder unusable (the file it lacks, an
architecture this transformers does not know), naming the file; `load_tokenizer(path)` reads the tokenizer from
the same folder.  Nothing here goes to the network: every load is `local_files_only`, with the Hub offline."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import ConfigError
from ..optional import quiet_import

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model")


def looks_like_path(source: object) -> bool:
    """A model string meant as a folder (a path separator, ~ or ., or a folder that exists), not a family name."""
    if not isinstance(source, str | os.PathLike):
        return False
    text = os.fspath(source)
    return os.sep in text or "/" in text or text.startswith(("~", ".")) or Path(text).is_dir()


def checkpoint_problem(path: str | os.PathLike) -> str:
    """Why `path` is not a checkpoint folder scalekit can load (naming the file), or ''."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        return f"{folder}: no such folder" if not folder.exists() else f"{folder}: not a folder"
    config = folder / "config.json"
    if not config.is_file():
        return f"{config}: missing (a checkpoint folder has the config.json save_pretrained writes)"
    try:
        model_type = json.loads(config.read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError) as exc:
        return f"{config}: unreadable ({exc})"
    if not any((folder / name).is_file() for name in WEIGHT_FILES):
        return f"{folder}: no weights (looked for {', '.join(WEIGHT_FILES)})"
    known = _known_model_types()
    if model_type not in known:
        return f"{config}: model_type {model_type!r} is not an architecture this transformers knows"
    return ""


def check_checkpoint(path: str | os.PathLike, field: str) -> Path:
    """The folder, or a ConfigError naming `field` and what is wrong with it."""
    if problem := checkpoint_problem(path):
        raise ConfigError(f"{field}: {problem}")
    return Path(path).expanduser()


def tokenizer_problem(path: str | os.PathLike) -> str:
    folder = Path(path).expanduser()
    if any((folder / name).is_file() for name in TOKENIZER_FILES):
        return ""
    return f"{folder}: no tokenizer files (looked for {', '.join(TOKENIZER_FILES)})"


def load_tokenizer(path: str | os.PathLike, field: str = "model"):
    """The tokenizer saved in checkpoint folder `path` (AutoTokenizer, local files only)."""
    if problem := tokenizer_problem(path):
        raise ConfigError(f"{field}: {problem}")
    transformers = _offline_transformers()
    return transformers.AutoTokenizer.from_pretrained(str(Path(path).expanduser()), local_files_only=True)


def _offline_transformers():
    os.environ["HF_HUB_OFFLINE"] = "1"  # a local folder never needs the Hub; nothing may reach for it
    try:
        return quiet_import("transformers")
    except ImportError as exc:
        raise ConfigError("a checkpoint folder needs transformers: pip install 'scalekit[hf]'") from exc


def _known_model_types() -> set[str]:
    transformers = _offline_transformers()
    return set(transformers.models.auto.configuration_auto.CONFIG_MAPPING_NAMES)
