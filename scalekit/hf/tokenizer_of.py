"""Which tokenizer a run's data file goes through: the model's own.

- the built-in GPT (no RunConfig.model): the shipped corpus's character tokenizer (scalekit.data.CharTokenizer),
  the one its vocabulary and the shipped weights were made with; characters it has no id for are left out, and
  the run's notes say how many;
- a checkpoint folder (RunConfig.model="PATH"): the tokenizer saved in it (checkpoint_folder.load_tokenizer);
- a Hugging Face model or adapter loaded from a folder (`from_pretrained(PATH)`: its config's name_or_path is that
  folder, with tokenizer files in it): the tokenizer of that folder;
- anything else (a model built from a config, your own nn.Module) has no tokenizer: refused, saying what to give.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..data import CharTokenizer, corpus_text
from ..data.tokenized import TokenizedFile, tokenize_file
from ..errors import ConfigError
from ..files import expand_user
from ..models.family import ModelAdapter
from .checkpoint_folder import load_tokenizer, tokenizer_problem
from .model import HFCausalLM, is_hf_model


def tokenizer_folder(model: Any) -> Path | None:
    """The checkpoint folder whose tokenizer `model`'s text goes through, or None (none is known)."""
    if isinstance(model, str | os.PathLike):
        folder = expand_user(model)
        return folder if folder.is_dir() else None
    folder = getattr(model, "folder", None) if isinstance(model, ModelAdapter) else None
    if folder is None:
        config = model.config if is_hf_model(model) else \
            model.hf_config if isinstance(model, HFCausalLM) else None
        folder = getattr(config, "name_or_path", None) or None
    if folder and expand_user(folder).is_dir() and not tokenizer_problem(folder):
        return expand_user(folder)
    return None


def no_tokenizer(model: Any, data: str) -> str:
    """Why RunConfig.data=`data` cannot be tokenized for `model` ('' when it can)."""
    if model is None:
        return ""
    folder = tokenizer_folder(model)
    if folder is not None:
        problem = tokenizer_problem(folder)
        return f"RunConfig.data={data!r} is tokenized with the model's own tokenizer: {problem}" if problem else ""
    what = repr(os.fspath(model)) if isinstance(model, str | os.PathLike) else f"a {type(model).__name__}"
    return (f"RunConfig.data={data!r} is tokenized with the model's own tokenizer, and RunConfig.model ({what}) "
            f"has none: give the model as a checkpoint folder (RunConfig(model=\"PATH\"), "
            f"--hf-model PATH) whose tokenizer files are beside its weights, or tokenize the file yourself and give "
            f"RunConfig.dataset")


def data_tokenizer(model: Any, data: str):
    """The tokenizer RunConfig.data=`data` goes through for RunConfig.model=`model`."""
    if model is None:
        return CharTokenizer(corpus_text())
    if why := no_tokenizer(model, data):
        raise ConfigError(why)
    return load_tokenizer(tokenizer_folder(model), field="RunConfig.model")


def tokenized_data(cfg: Any) -> TokenizedFile:
    """The run's data file (RunConfig.data, a path) tokenized with its model's tokenizer: from the cache when it
    was tokenized before with the same tokenizer, else tokenized now and cached."""
    return tokenize_file(cfg.data, data_tokenizer(cfg.model, cfg.data), cfg.text_field)
