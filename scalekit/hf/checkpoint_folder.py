"""A Transformers checkpoint folder on disk, as `save_pretrained` writes it: config.json, the weights
(model.safetensors, sharded with an index, or pytorch_model.bin) and, beside them, the tokenizer's files.

`checkpoint_problem(path)` says, before anything is loaded, what makes a folder unusable (the file it lacks, an
architecture this transformers does not know), naming the file; `load_tokenizer(path)` reads the tokenizer from
the same folder.  `checkpoint_model(path, field)` is what a config makes of a model given as a folder
(RunConfig.model, GenerateConfig.model, `--hf-model PATH`): an `HFCheckpoint`, the family scalekit.hf.HFCausalLM
of the folder's config, whose every build loads the folder's weights (`from_pretrained`, safetensors, in fp32 as
a model built from a config), so the toggles reach it as they reach a family built from a config.  Built on the
meta device or on the planner's fake tensors it is built from the config: shapes only, no weight read.  Nothing
here goes to the network: every load is `local_files_only`, with the Hub offline."""

from __future__ import annotations

import contextlib
import copy
import json
import os
from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigError
from ..files import expand_user
from ..optional import quiet_import
from .model import HFCausalLM, _transformers

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
    folder = expand_user(path)
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
    return expand_user(path)


def tokenizer_problem(path: str | os.PathLike) -> str:
    folder = expand_user(path)
    if any((folder / name).is_file() for name in TOKENIZER_FILES):
        return ""
    return f"{folder}: no tokenizer files (looked for {', '.join(TOKENIZER_FILES)})"


def load_tokenizer(path: str | os.PathLike, field: str = "model"):
    """The tokenizer saved in checkpoint folder `path` (AutoTokenizer, local files only)."""
    if problem := tokenizer_problem(path):
        raise ConfigError(f"{field}: {problem}")
    transformers = _offline_transformers()
    return transformers.AutoTokenizer.from_pretrained(str(expand_user(path)), local_files_only=True)


def _offline_transformers():
    os.environ["HF_HUB_OFFLINE"] = "1"  # a local folder never needs the Hub; nothing may reach for it
    try:
        return quiet_import("transformers")
    except ImportError as exc:
        raise ConfigError("a checkpoint folder needs transformers: pip install 'scalekit[hf]'") from exc


def _known_model_types() -> set[str]:
    transformers = _offline_transformers()
    return set(transformers.models.auto.configuration_auto.CONFIG_MAPPING_NAMES)


def checkpoint_model(source: Any, field: str) -> Any:
    """`source` as a config's model: a path (looks_like_path) becomes the HFCheckpoint of that folder, refused
    (ConfigError naming `field` and the file) before any weight is read; anything else is returned as it is."""
    if isinstance(source, HFCheckpoint) or not looks_like_path(source):
        return source
    return HFCheckpoint(check_checkpoint(source, field), field)


class HFCheckpoint(HFCausalLM):
    """A Transformers checkpoint folder as a model family: its config read from config.json once, its weights
    loaded at every build with `from_pretrained` (local files only, fp32), the toggles' switches made as
    HFCausalLM makes them for a model built from a config (attn_implementation, the padded vocabulary, ...)."""

    def __init__(self, folder: str | os.PathLike, field: str = "model", config: Any = None,
                 quantization: dict | None = None, device: str | None = None):
        self.folder = expand_user(folder)
        if config is None:
            config = _read_config(self.folder, field)
        super().__init__(config)
        self.field = field
        self.quantization = quantization  # BitsAndBytesConfig's arguments: the weights quantized as they load
        self.device = device  # where a quantized load puts them (None: where transformers puts them, a GPU first)
        self.__qualname__ = str(self.folder)  # what a config's to_dict names the model by: the folder
        mapping = _offline_transformers().AutoModelForCausalLM._model_mapping
        if type(config) not in mapping:
            raise ConfigError(f"{field}: {self.folder / 'config.json'}: model_type {config.model_type!r} "
                              f"({type(config).__name__}) has no causal-LM model in transformers")

    def copy(self) -> HFCheckpoint:
        fresh = HFCheckpoint(self.folder, self.field, self.source, self.quantization, self.device)
        fresh._config, fresh._class = self._config, self._class
        return fresh

    def resolve(self, cfg: Any, preset: Any) -> dict:
        """HFCausalLM's fields, and the model loaded quantized where a toggle holds its weights so (quantized_base:
        Toggle.loaded_quantized); layers chosen by name (RunConfig.adapter_targets) are swapped once loaded instead,
        as for any model, since transformers quantizes every linear layer but the head."""
        from ..toggles import TOGGLES

        fields = super().resolve(cfg, preset)
        asked = [TOGGLES[name].loaded_quantized(value) for name, value in cfg.toggles.items()]
        quantization = next((q for q in asked if q), None) if cfg.adapter_targets is None else None
        device = None if cfg.device == "auto" else cfg.device
        if quantization != self.quantization or (quantization and device != self.device):
            fields["model"] = HFCheckpoint(self.folder, self.field, self.source, quantization, device)
        return fields

    def _make(self) -> torch.nn.Module:
        if _shapes_only():  # the planner (fake tensors) or a parameter count (meta): the config alone
            return super()._make()
        _offline_transformers()  # the Hub switched off
        transformers = _transformers()  # its model code imported quietly (it imports torchao where installed)
        safetensors = any((self.folder / name).is_file() for name in WEIGHT_FILES[:2])
        quantized = {}
        if self.quantization:
            quiet_import("bitsandbytes")  # imported with the Hub offline: on a CPU it looks for a kernel there
            config = transformers.BitsAndBytesConfig(**self.quantization, bnb_4bit_compute_dtype=torch.float32)
            quantized = dict(quantization_config=config, device_map={"": self.device} if self.device else None)
        with _no_progress_bar(transformers):
            # a copy of the config: the model keeps and changes its own (resize_token_embeddings sets vocab_size)
            return transformers.AutoModelForCausalLM.from_pretrained(
                str(self.folder), config=copy.deepcopy(self.source), local_files_only=True,
                use_safetensors=safetensors or None, dtype=torch.float32,
                attn_implementation=self.attn_implementation, **quantized)

    def tokenizer(self, field: str | None = None):
        """The folder's tokenizer (refused, naming the folder, where it has no tokenizer files)."""
        return load_tokenizer(self.folder, field or self.field)

    @property
    def family(self) -> str:
        return f"Hugging Face {self.model_class.__name__} from {self.folder}"

    def __repr__(self) -> str:
        return f"HFCheckpoint({str(self.folder)!r})"


def _read_config(folder: Path, field: str):
    transformers = _offline_transformers()
    try:
        return transformers.AutoConfig.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{field}: {folder / 'config.json'}: transformers cannot read it "
                          f"({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''})") from None


def _shapes_only() -> bool:
    """Tensors made here have no data: the default device is meta, or torch runs under fake tensors."""
    from torch._subclasses.fake_tensor import FakeTensor

    probe = torch.empty(0)
    return probe.is_meta or isinstance(probe, FakeTensor)


@contextlib.contextmanager
def _no_progress_bar(transformers):
    """from_pretrained without its "Loading weights" bar (a run's output is its own), the setting put back."""
    logging = transformers.utils.logging
    was = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            logging.enable_progress_bar()
