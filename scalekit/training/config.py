"""RunConfig: everything that defines one measured run, validated up front with errors that name the field."""

from __future__ import annotations

import dataclasses
import numbers
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..checks import (
    BATCH_SIZE_RANGE,
    LR_RANGE,
    SEED_RANGE,
    check_bool,
    check_device,
    check_label,
    check_threads,
    int_in,
)
from ..data import DATA_SOURCES, DEFAULT_TRANSFORM_ROUNDS, check_dataset
from ..data.files import ALLOWED as DATA_FILES
from ..data.files import data_format, is_data_path, path_exists
from ..distributed.sharding import mesh_shape
from ..errors import ConfigError, ToggleUnavailable, toggle_why
from ..hf.checkpoint_folder import checkpoint_model
from ..hf.family_of import model_adapter, toggle_family
from ..hf.tokenizer_of import no_tokenizer
from ..models.import_spec import import_named_code
from ..models.presets import CPU_DEFAULT_PRESET, GPU_DEFAULT_PRESET, PRESETS
from ..toggles import TOGGLES, check_combination, mesh_dims, normalise, replicas_in_step

PRESET_NAMES = ("auto", *PRESETS)


def _allowed(values) -> str:
    return ", ".join(str(v) for v in values)


@dataclass
class RunConfig:
    """One run: a model, its data and batch, the toggles switched on, and how long to measure."""

    preset: str = "auto"
    """Built-in GPT size: 'tiny', 'small', 'medium', 'tiny-vocab50k', 'gpt2-124m', 'shakespeare-char' (the shipped
    model's shape), or 'auto' (tiny on CPU, gpt2-124m on GPU)."""
    toggles: Mapping[str, Any] | Sequence[str] = field(default_factory=dict)
    """Optimizations to switch on: names, or {name: True | mode}, e.g. {"compile": "max-autotune"}."""
    batch_size: int | None = None
    """Sequences per optimizer step (None: the preset's default)."""
    seq_len: int | None = None
    """Tokens per sequence (None: the preset's context length)."""
    steps: int = 20
    """Measured steps (after the warm-up)."""
    warmup_steps: int = 3
    """Steps run first and not measured (compilation and allocator warm-up happen here)."""
    log_every: int = 5
    """Read the loss (a device sync) every this many steps."""
    data: str = "auto"
    """'shakespeare' (the shipped corpus, pre-tokenized), 'shakespeare-raw' (its raw text, tokenized and
    transformed per sample: the slow pipeline of chapter 05), 'synthetic' (random tokens), 'new-plays' (the
    corpus' tail the shipped model never saw, for fine-tuning), 'auto' (the preset's choice), or the path of your
    data file: .jsonl, .json, .parquet, .txt (one document), a folder saved by datasets.save_to_disk or a folder of
    .txt files, tokenized once with the model's own tokenizer and cached (scalekit.data.tokenized); the run trains
    on its first 90% of tokens, and its held-out loss is measured on the rest before and after."""
    transform_rounds: int | None = None
    """With data='shakespeare-raw': what its per-sample transform (character noise) costs, in hash rounds per
    token (the work grows linearly with it; 0: no transform; None: scalekit.data.DEFAULT_TRANSFORM_ROUNDS)."""
    lr: float = 1e-3
    """AdamW learning rate."""
    seed: int = 1337
    """Seed for weights, data order and synthetic tokens."""
    device: str = "auto"
    """'auto' (first GPU, else CPU), 'cpu', 'cuda' or 'cuda:N'."""
    measure_memory: bool = True
    """On CPU, run one extra unmeasured step with live-tensor accounting to find the peak memory."""
    peak_tflops: float | None = None
    """Dense peak TFLOP/s of the device for MFU; None uses scalekit's table (unknown device: MFU n/a)."""
    model: Callable[[], torch.nn.Module] | torch.nn.Module | None = None
    """Your own model (or a function that builds one) instead of the built-in GPT; a Hugging Face causal LM
    (a PreTrainedModel, scalekit.hf.causal_lm(...), or the path of a checkpoint folder save_pretrained wrote,
    loaded offline) needs no batch_fn or loss_fn."""
    batch_fn: Callable[[int, torch.device], Any] | None = None
    """With `model`: batch_fn(batch_size, device) -> a batch for loss_fn, synthetic batches made in the training
    process (a Hugging Face model without batch_fn or dataset: the shipped corpus)."""
    dataset: Any = None
    """With `model`, instead of batch_fn: your data, a map-style or iterable torch Dataset or a Hugging Face
    datasets.Dataset with input_ids; scalekit builds the DataLoader, so the data toggles act on it."""
    collate_fn: Callable | None = None
    """With `dataset`: the DataLoader's collate_fn (None: torch's default, which stacks samples)."""
    loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor] | None = None
    """With `model`: loss_fn(model, batch) -> scalar loss (a Hugging Face model: its own `.loss`)."""
    tokens_per_sample: int = 1
    """With `model`: tokens (or items) per sample, for throughput in tokens/s."""
    label: str | None = None
    """Name of the run in tables and plots (None: made from the toggles)."""
    init: str = "random"
    """The built-in GPT's starting weights: 'random' (GPT-2's initialisation) or 'pretrained' (the shipped weights
    of presets that have them: 'shakespeare-char')."""
    adapter_targets: Sequence[str] | None = None
    """Names of the linear layers that lora/dora/quantized_base act on (e.g. ('c_attn',)); None: every linear
    layer inside the model's repeated blocks."""
    check_memory: bool = True
    """Refuse, before building, a run whose planned peak memory is over the machine's limit (a GPU's free memory, or the
    smaller of RAM and the container's cgroup limit) by more than the planner's error (scalekit.plan.check_fits)."""
    notes: tuple[str, ...] = field(default=(), compare=False)
    """What was said when the config was made, e.g. the TrainingArguments fields from_training_arguments did not
    map (kept here, not copied into results; not compared)."""
    eval_every: int = 0
    """Evaluate every this many measured steps (0: never): held-out loss under the generation toggles, untimed."""
    eval_batches: int = 2
    """Held-out batches each evaluation reads."""
    eval_new_tokens: int = 0
    """With eval_every: tokens of a greedy sample each evaluation writes (built-in GPT on the shipped corpus)."""
    threads: int | None = None
    """torch's intra-op threads for the run, restored after it (None: the cores other processes are not already
    using, at least one and at most torch's own setting, decided once per process so every row of a comparison
    gets the same; a launched rank keeps its launcher's)."""
    text_field: str = "text"
    """With data=PATH: the field of each row that holds its text (a file without it but with 'messages' is read as
    chats, through the tokenizer's chat template)."""

    def __post_init__(self) -> None:
        self.toggles = normalise(self.toggles)
        self.validate()

    # -- validation --------------------------------------------------------------------------------
    def validate(self) -> None:
        """Every field checked for type and range, with the field named and the allowed values said."""
        if not isinstance(self.preset, str) or self.preset not in PRESET_NAMES:
            raise ConfigError(f"RunConfig.preset: unknown preset {self.preset!r}; allowed: {_allowed(PRESET_NAMES)}")
        for name, (low, high) in INT_RANGES.items():
            value = getattr(self, name)
            if value is None and name in ("batch_size", "seq_len"):
                continue
            int_in("RunConfig", name, value, low, high)
        if isinstance(self.lr, bool) or not isinstance(self.lr, numbers.Real) or not (LR_RANGE[0] <= self.lr <= LR_RANGE[1]):
            raise ConfigError(f"RunConfig.lr must be a number from {LR_RANGE[0]:g} to {LR_RANGE[1]:g} (AdamW learning "
                              f"rates are around 1e-4 to 1e-2), got {self.lr!r}")
        for name in ("measure_memory", "check_memory"):
            check_bool("RunConfig", name, getattr(self, name))
        check_label("RunConfig", self.label)
        check_threads("RunConfig", self.threads)
        self._validate_data()
        check_device("RunConfig", self.device)
        if self.peak_tflops is not None and (isinstance(self.peak_tflops, bool) or not isinstance(
                self.peak_tflops, numbers.Real) or not (0 < self.peak_tflops <= 1e5)):
            raise ConfigError(f"RunConfig.peak_tflops must be a positive number of TFLOP/s (at most 1e5) or None, "
                              f"got {self.peak_tflops!r}")
        if not isinstance(self.notes, (tuple, list)) or not all(isinstance(n, str) for n in self.notes):
            raise ConfigError(f"RunConfig.notes must be a tuple of strings, got {self.notes!r}")
        self._validate_model()
        self._validate_init()
        check_combination(self.toggles)
        self._validate_loops()

    def _validate_data(self) -> None:
        if not isinstance(self.text_field, str) or not self.text_field:
            raise ConfigError(f"RunConfig.text_field must be the name of a field of your data file, got "
                              f"{self.text_field!r}")
        if isinstance(self.data, os.PathLike):
            self.data = os.fspath(self.data)
        if is_data_path(self.data):
            self._validate_data_file()
        elif not isinstance(self.data, str) or (self.data not in ("auto", *DATA_SOURCES)
                                                and not (self.data in ("custom", "dataset") and self.model is not None)):
            raise ConfigError(f"RunConfig.data: unknown data source {self.data!r}; allowed: "
                              f"{_allowed(('auto', *DATA_SOURCES))}, or the path of a data file ({DATA_FILES})")
        if self.transform_rounds is None:
            return
        int_in("RunConfig", "transform_rounds", self.transform_rounds, *TRANSFORM_ROUNDS_RANGE)
        if self.data not in ("shakespeare-raw", "auto"):  # 'auto' is checked once resolved (the data ladder's)
            _transform_without_raw(self.data)

    def _validate_data_file(self) -> None:
        """A data file: one that can be read, for a model with a tokenizer, that nothing else feeds."""
        if not path_exists(self.data):
            raise ConfigError(f"RunConfig.data: unknown data source {self.data!r}, and no file or folder of that name; "
                              f"allowed: {_allowed(('auto', *DATA_SOURCES))}, or the path of a data file ({DATA_FILES})")
        data_format(self.data)
        for other in ("dataset", "batch_fn"):
            if getattr(self, other) is not None:
                raise ConfigError(f"RunConfig.data={self.data!r} and RunConfig.{other} both give the data: give one")
        if why := no_tokenizer(self.model, self.data):
            raise ConfigError(why)
        if self.model is None and "sequence_packing" in self.toggles:
            raise ConfigError(f"RunConfig.toggles: sequence_packing packs the documents of RunConfig.data="
                              f"{self.data!r} into rows with per-document position ids and a block-diagonal "
                              f"attention mask, which the built-in GPT's forward does not take: give a Hugging Face "
                              f"model (a checkpoint folder), or leave sequence_packing off (the file is read as "
                              f"windows of its tokens end to end)")

    def _validate_model(self) -> None:
        import_named_code(self, ("model", "batch_fn", "loss_fn"))  # "mypkg.models:make": what it names
        self.model = checkpoint_model(self.model, "RunConfig.model")  # a checkpoint folder's path: its family
        adapter = model_adapter(self.model)  # a model family's defaults and switches (Hugging Face), or None
        self._validate_dataset()
        batches = self.batch_fn if self.batch_fn is not None else self.dataset
        custom = (self.model, batches, self.loss_fn)
        if adapter is None and any(x is not None for x in custom) and not all(x is not None for x in custom):
            given = [n for n, x in zip(("model", "batch_fn", "loss_fn"), custom, strict=True) if x is not None]
            missing = [n for n, x in zip(("model", "batch_fn", "loss_fn"), custom, strict=True) if x is None]
            raise ConfigError(f"{' and '.join(f'RunConfig.{n}' for n in given)} without {' and '.join(missing)}: "
                              f"model, batch_fn (or dataset) and loss_fn go together: give all three for your own "
                              f"model (a Hugging Face model needs only model: scalekit.hf.causal_lm(...) or a "
                              f"PreTrainedModel)")
        if self.model is None:
            return
        if not (isinstance(self.model, torch.nn.Module) or callable(self.model)):
            raise ConfigError("RunConfig.model must be an nn.Module or a function returning one (a transformers "
                              "config: scalekit.hf.causal_lm(config))")
        for name in ("batch_fn", "loss_fn"):
            if getattr(self, name) is not None and not callable(getattr(self, name)):
                raise ConfigError(f"RunConfig.{name} must be a function, got {type(getattr(self, name)).__name__}")
        for name in self.toggles:
            ok, why = TOGGLES[name].applies_to(adapter or toggle_family(self.model))
            if not ok:
                raise ToggleUnavailable(f"RunConfig.toggles: {toggle_why(name, why)}")

    def _validate_dataset(self) -> None:
        if self.collate_fn is not None and (self.dataset is None or not callable(self.collate_fn)):
            raise ConfigError("RunConfig.collate_fn goes with RunConfig.dataset, and must be a function")
        if self.dataset is None:
            return
        if self.batch_fn is not None:
            raise ConfigError("RunConfig.dataset and batch_fn both make the batches: give one of them")
        if self.model is None:
            raise ConfigError("RunConfig.dataset feeds your own model (RunConfig.model, or a Hugging Face model); the "
                              "built-in GPT reads RunConfig.data")
        check_dataset(self.dataset)

    def _validate_init(self) -> None:
        if self.init not in INITS:
            raise ConfigError(f"RunConfig.init must be one of {_allowed(INITS)}, got {self.init!r}")
        if self.init == "pretrained":
            with_weights = [name for name, p in PRESETS.items() if p.pretrained]
            if self.model is not None or self.preset not in with_weights:
                raise ConfigError(f"RunConfig.init='pretrained' needs a preset that ships weights: "
                                  f"{_allowed(with_weights)} (got preset {self.preset!r}"
                                  f"{' and your own model' if self.model is not None else ''})")
        if self.adapter_targets is not None:
            targets = self.adapter_targets
            if isinstance(targets, str) or not isinstance(targets, Sequence) or not targets or \
                    not all(isinstance(t, str) and t for t in targets):
                raise ConfigError(f"RunConfig.adapter_targets must be None or a non-empty list of linear layer "
                                  f"names (e.g. ['c_attn', 'c_fc']), got {targets!r}")
            self.adapter_targets = tuple(targets)

    def _validate_loops(self) -> None:
        """Toggles that apply to generation only act on a training run's evaluation (eval_every); none may
        replace the weights of the model being trained."""
        for name in self.toggles:
            toggle = TOGGLES[name]
            if "train" in toggle.loops:
                continue
            if toggle.changes_weights:
                raise ConfigError(f"RunConfig.toggles: {name!r} replaces the model's weights and applies to "
                                  f"generation (scalekit.generate, `scalekit generate`), not to a model in training")
            if not self.eval_every:
                raise ConfigError(f"RunConfig.toggles: {name!r} applies to generation; in a training run it acts on "
                                  f"the evaluation: set RunConfig.eval_every (or use scalekit.generate)")
        if self.eval_new_tokens and not self.eval_every:
            raise ConfigError("RunConfig.eval_new_tokens writes a sample at each evaluation: set RunConfig.eval_every too")

    @property
    def custom_model(self) -> bool:
        return self.model is not None

    # -- resolution against the hardware -----------------------------------------------------------
    def resolve(self, hw) -> RunConfig:
        """A copy with every 'auto' and None made concrete for the device `hw`."""
        preset = self.preset
        if preset == "auto":
            preset = GPU_DEFAULT_PRESET if hw.device_type == "cuda" else CPU_DEFAULT_PRESET
        p = PRESETS[preset]
        data = self.data if self.data != "auto" else p.data
        if self.custom_model:
            data = "dataset" if self.dataset is not None else "custom"
        batch = self.batch_size or p.batch_size
        seq = self.seq_len or p.block_size
        rounds = self.transform_rounds
        if data == "shakespeare-raw" and rounds is None:
            rounds = DEFAULT_TRANSFORM_ROUNDS
        elif data != "shakespeare-raw" and rounds is not None:
            _transform_without_raw(data)
        fields = dict(preset=preset, data=data, batch_size=batch, seq_len=seq, transform_rounds=rounds,
                      toggles=dict(self.toggles), label=self.label or self.describe())
        adapter = model_adapter(self.model)
        if adapter is not None:  # the model's own limits and defaults (a Hugging Face model's context, its data)
            fields.update(adapter.resolve(self, p))
        return dataclasses.replace(self, **fields)

    def describe(self) -> str:
        if not self.toggles:
            return "baseline"
        # a mode named "default" goes unsaid ("compile", not "compile=default"); other values are said
        return " + ".join(n if v is True or v == "default" else f"{n}={v}" for n, v in self.toggles.items())

    def check_available(self, hw) -> None:
        """Raise ToggleUnavailable for the first toggle (or mode) this machine cannot run, with the reason: what
        each toggle's choice_available says, asked before anything is built."""
        for name, value in self.toggles.items():
            ok, why = TOGGLES[name].choice_available(hw, value)
            if not ok:
                raise ToggleUnavailable(f"RunConfig.toggles: toggle {name!r} is unavailable on this machine: {why}")

    def check_ranks(self, world: int) -> None:
        """Refused (ConfigError, naming every number) when the parallel toggles' one mesh cannot be laid over
        `world` ranks: the check each rank's build makes (parallel.mesh_shape), made before any rank starts; and
        when the mesh leaves several data-parallel replicas that no toggle keeps in step (toggles.replicas_in_step:
        tensor_parallel=2 alone on 4 ranks)."""
        dims = mesh_dims(self.toggles)
        if not dims:
            return
        try:
            replicas_in_step(self.toggles, mesh_shape(dims, world), world)
        except ConfigError as exc:
            raise ConfigError(f"RunConfig.toggles: {exc}") from None

    # -- Hugging Face TrainingArguments (scalekit.hf.arguments holds the table of what maps to what) ------------
    @classmethod
    def from_training_arguments(cls, args: Any, world_size: int | None = None, train_dataset: Any = None,
                                **fields) -> RunConfig:
        """A RunConfig from a transformers TrainingArguments (or the dict of its keyword arguments): batch, accumulation,
        checkpointing, precision, optimizer, data-loader, empty_cache and compile settings, lr and seed.  Every field
        it does not map is listed in `notes`.  `world_size`: the processes the Trainer runs in (default: the
        arguments' own world_size, 1 for a dict); `train_dataset`: the Trainer's, read through the DataLoader the
        data-loader fields configure (RunConfig.dataset); `fields` set the rest (model=..., steps=...)."""
        from ..hf.arguments import run_config_fields

        if train_dataset is not None:
            fields["dataset"] = train_dataset
        mapped, notes = run_config_fields(args, world_size)
        notes = tuple(fields.pop("notes", ())) + tuple(notes)
        return cls(**{**mapped, **fields}, notes=notes)

    def to_training_arguments(self, world_size: int = 1) -> dict:
        """Keyword arguments for transformers.TrainingArguments that run this config's settings (per-device
        batch = batch_size / (grad_accum × world_size)).  Toggles TrainingArguments has no field for are named
        in a warning (scalekit.hf.export_code writes the code for them)."""
        from ..hf.arguments import training_arguments

        return training_arguments(self, world_size)

    def to_dict(self) -> dict:
        """The fields that describe the run, JSON-friendly (a custom model is named by its class)."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in ("model", "batch_fn", "loss_fn", "dataset", "collate_fn"):
                value = None if value is None else getattr(value, "__qualname__", type(value).__qualname__)
            out[f.name] = dict(value) if f.name == "toggles" else value
        return out


# (smallest, largest) for each whole-number field: far beyond these a run is a mistake, not an experiment
INT_RANGES = {
    "batch_size": BATCH_SIZE_RANGE,
    "seq_len": (1, 2**20),
    "steps": (1, 10**8),
    "warmup_steps": (0, 10**7),
    "log_every": (1, 10**8),
    "tokens_per_sample": (1, 2**30),
    "seed": SEED_RANGE,
    "eval_every": (0, 10**8),
    "eval_batches": (1, 10**4),
    "eval_new_tokens": (0, 10**5),
}
INITS = ("random", "pretrained")
TRANSFORM_ROUNDS_RANGE = (0, 100_000)


def _transform_without_raw(data: str) -> None:
    raise ConfigError(f"RunConfig.transform_rounds sets the cost of the per-sample transform of "
                      f"data='shakespeare-raw'; data={data!r} has no such transform: leave it None")
