"""The Toggle interface, the build context toggles act on, and what a toggle declares for autotune (Tune) and
the frameworks' code (Spelling).

A toggle acts once, at its phase, on a freshly built run: "off" means building again without it, never
undoing it (torch.compile and FSDP cannot be undone).  Phases run in the order of `PHASES` (the engine
walks that tuple; scalekit.toggles.vocabulary holds it, with the other values a toggle may name); toggles within
a phase run in the order `scalekit.toggles.ORDER` fixes.  A generation (scalekit.inference) walks the same tuple
with loop="generate": only toggles whose `loops` hold it act.

Toggles never test each other's names: they meet in the fields of `BuildContext`, each declared below
with what it means.  The context has slots, so setting a field it does not declare is an error.
"""

from __future__ import annotations

import contextlib
import inspect
import textwrap
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..errors import ConfigError
from .source import _called_functions
from .vocabulary import check_declared

if TYPE_CHECKING:
    from .facts import PlanFacts


@dataclass(slots=True)
class BuildContext:
    """What toggles read and change while a run is being built; every field is declared here."""

    config: Any  # the resolved RunConfig
    hw: Any  # scalekit.machine.hardware.Hardware
    device: torch.device  # where the run computes (this rank's GPU, or the CPU)
    stack: contextlib.ExitStack  # process-wide changes and wrappers register their undo/teardown here
    world_size: int = 1  # ranks this run is spread over (1: one process)
    # -- precision (set in the "precision" phase; read by wrappers, the step and MFU) --------------------
    compute_dtype: torch.dtype | None = None  # autocast dtype around forward (None: fp32, no autocast)
    wrapper_param_dtype: torch.dtype | None = None  # dtype sharding wrappers (FSDP2, DeepSpeed) compute in
    tf32_matmuls: bool = False  # fp32 matmuls run as TF32 (for the MFU peak)
    grad_scaler: Any = None  # torch.amp.GradScaler for fp16 loss scaling, used by the stepper
    # -- data ------------------------------------------------------------------------------------------
    loader_kwargs: dict = field(default_factory=dict)  # DataLoader options set by data toggles
    read_training_format: bool = False  # shakespeare-raw reads the pre-tokenized memmap instead of raw text
    batch_transforms: bool = False  # shakespeare-raw's per-sample transform runs once per batch, with tensor ops
    non_blocking_copy: bool = False  # batches are copied to the device with non_blocking=True
    batch_wrappers: list = field(default_factory=list)  # callables(batches) -> batches around the pipeline (echo)
    batch_counter: Any = None  # the pipeline's batches, counted before any wrapper (data.CountedBatches)
    batches: Iterator | None = None  # the run's batches (this rank's slice of each global batch)
    pack_sequences: bool = False  # the dataset's documents packed into full rows (data.packing); real tokens counted
    # -- model -----------------------------------------------------------------------------------------
    gpt_config: Any = None  # GPTConfig before the built-in GPT is built (None for a user's own model)
    model_adapter: Any = None  # the model's family (ModelAdapter): how toggles change it (generation: always set)
    base_model: torch.nn.Module | None = None  # the model as built, unwrapped: FLOPs, memory, checkpoints
    model: torch.nn.Module | None = None  # what the step calls: base_model under its wrappers
    blocks: torch.nn.Module | None = None  # the repeated blocks (models.blocks.find_blocks), or None
    loss_fn: Callable | None = None  # loss_fn(model, batch) -> scalar loss
    compiled: bool = False  # the model is wrapped by torch.compile
    offload_to_cpu: bool = False  # sharded state lives in host memory (read by fsdp when it shards)
    no_sync: Any = None  # model.no_sync-like: a context for micro-steps that must not all-reduce
    # -- optimizer and step ----------------------------------------------------------------------------
    optimizer_kwargs: dict = field(default_factory=dict)  # options for the default torch AdamW
    optimizer_factory: Callable | None = None  # params -> Optimizer; None: torch AdamW with optimizer_kwargs
    optimizer: torch.optim.Optimizer | None = None  # built over the final parameters (engine.build_optimizer)
    stepper: Any = None  # backward(loss, boundary) and step(): OptimizerStep, or an engine that owns them
    grad_accum_steps: int = 1  # micro-batches per optimizer step (the batch is split along dim 0)
    optimizer_state_sharded: bool = False  # each rank steps and keeps the state of only its share of the weights (ZeRO-1)
    # set with `mesh`, before any toggle acts; read at the first batch (and by the engine's per-rank figures)
    data_parallel: tuple[int, int] | None = None  # (this rank's index, ranks) among those splitting each batch; None: all
    # pipeline_parallel takes its 'pp' dimension, tensor_parallel 'tp', fsdp shards over 'dp'
    mesh: Any = None  # the run's one (pp, dp, tp) DeviceMesh from the toggles' mesh_dims, built before they act; or None
    after_step: list = field(default_factory=list)  # callables(step_index) run after each optimizer step
    # -- generation and evaluation (the "generate" loop, and eval_every in training) -----------------------
    inference_context: Callable = torch.no_grad  # the grad mode generation and evaluation run under
    kv_cache: str | None = None  # the KV cache decode keeps (models.kv_cache.CACHE_KINDS); None: re-read the sequence
    reference_model: torch.nn.Module | None = None  # the model as built, before wrap-phase toggles changed it
    built_weight_bytes: int | None = None  # bytes of the weights as built, before quantization changed them
    speculative: Any = None  # models.speculative.Speculation: how decoding speculates (None: one token per forward)
    draft: Any = None  # (family, model) of the draft model the speculative loop proposes with, built beside the model
    evaluator: Any = None  # evaluation run between training steps, untimed (RunConfig.eval_every), or None
    notes: list[str] = field(default_factory=list)  # said beside the run's results


@dataclass(frozen=True)
class Tune:
    """One change autotune tries (scalekit.autotune): switch the toggle to `value` in `loop`'s search, at `rank`
    in the order the changes are tried (lower first).  A tuple `value` means the first of them that runs here."""

    value: Any = True
    rank: int = 0  # place in the search order (build-nanogpt's ladder first, then data, then memory levers)
    loop: str = "train"  # "train" or "generate"
    label: str = ""  # what the search calls it ("" → the toggle's name, and its value unless True)
    memory_only: bool = False  # tried only while the best so far is over the memory budget
    instead_of: str = ""  # tried only where that toggle is unavailable (fp16 where there is no bf16)
    # its runs start with a one-off cost no stop flag can cut short (compilation): the search budgets it once
    # it has seen one, and says before starting that the first may run past the time budget
    uninterruptible: bool = False
    # greedy tokens must equal the unmodified model's (speculative decoding): autotune refuses any difference
    exact: bool = False


def needs_a_gpu(hw, what: str) -> tuple[bool, str]:
    """Available on a CUDA device; on the CPU, unavailable with the reason."""
    if hw.device_type == "cuda":
        return True, ""
    return False, (f"{what} is about copying batches from host memory to a CUDA GPU; this run is on the CPU, "
                   f"where batches are not copied at all")


EXPORT_TARGETS = ("hf", "accelerate", "lightning")  # the frameworks a toggle is spelled in (Toggle.spelling)


@dataclass(frozen=True)
class Call:
    """A call written in exported code, `name(key=value, ...)`, the values as source text.  Where two toggles spell
    one keyword argument as calls of one name, their arguments merge (cpu_offload's into fsdp's plugin)."""

    name: str
    kwargs: Mapping[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.name}({', '.join(f'{k}={v}' for k, v in self.kwargs.items())})"


@dataclass(frozen=True)
class Spelling:
    """How one toggle is written in one framework's code (Toggle.spelling).  scalekit.hf.arguments and
    scalekit.hf.export walk a config's toggles in ORDER and put these pieces in place, so they name no toggle:
    what toggles write when off is laid down first, then each toggle that is on writes over it.  A keyword argument
    two toggles write merges where both are dicts or Calls of one name; otherwise the later toggle's value stands."""

    kwargs: Mapping[str, Any] = field(default_factory=dict)  # TrainingArguments (values), Accelerator, L.Trainer (source, Call)
    imports: tuple[str, ...] = ()  # import lines the pieces below need
    setup: tuple[str, ...] = ()  # lines run first: process-wide flags (Accelerate: atop the training function)
    model_kwargs: Mapping[str, str] = field(default_factory=dict)  # AutoModelForCausalLM.from_config's, as source text
    model: tuple[str, ...] = ()  # lines run on the built `model`, in ORDER: vocabulary, weights, adapters, what trains
    wrap: tuple[str, ...] = ()  # Lightning: LightningModule.configure_model's lines, on self.model (checkpointing, compile)
    loader: Mapping[str, str] = field(default_factory=dict)  # DataLoader keyword arguments, source (Accelerate, Lightning)
    optimizer: str = ""  # the optimizer over the model's parameters, source (Accelerate, Lightning); the later one stands
    after_step: tuple[str, ...] = ()  # lines after each optimizer step (Accelerate: its loop; Lightning: on_train_batch_end)
    notes: tuple[str, ...] = ()  # what the code carries only approximately, said beside it
    missing: str = ""  # why this framework cannot carry the toggle ("" when it can): a `# not carried:` line, a warning
    gpu_only: bool = False  # the framework refuses it where there is no GPU: code exported on such a machine leaves it out

    def then(self, later: Spelling) -> Spelling:
        """This spelling and a later toggle's together, by the rules above (`missing` is the caller's to say)."""
        kwargs = dict(self.kwargs)
        for key, value in later.kwargs.items():
            kwargs[key] = merged(kwargs[key], value) if key in kwargs else value
        return Spelling(kwargs=kwargs, imports=self.imports + tuple(i for i in later.imports if i not in self.imports),
                        setup=self.setup + later.setup, model_kwargs={**self.model_kwargs, **later.model_kwargs},
                        model=self.model + later.model, wrap=self.wrap + later.wrap, loader={**self.loader, **later.loader},
                        optimizer=later.optimizer or self.optimizer, after_step=self.after_step + later.after_step,
                        notes=self.notes + later.notes)


def merged(earlier: Any, later: Any) -> Any:
    """One keyword argument two toggles spell: dicts, and Calls of one name, merge (the later's keys standing); else
    the later value stands."""
    if isinstance(earlier, dict) and isinstance(later, dict):
        return {**earlier, **later}
    if isinstance(earlier, Call) and isinstance(later, Call) and earlier.name == later.name:
        return Call(later.name, {**earlier.kwargs, **later.kwargs})
    return later


def no_loader(cfg: Any, name: str) -> str | None:
    """Why a DataLoader toggle changes nothing for RunConfig `cfg` (None: its batches come from a DataLoader)."""
    if cfg.data == "synthetic":
        return f"{name} changes nothing for synthetic data: it is made on the device"
    if cfg.data == "custom":
        return (f"{name} changes nothing for batches your batch_fn makes: they are made in the training process, "
                f"with no DataLoader; give RunConfig.dataset and scalekit builds the DataLoader it acts on")
    return None


class Toggle:
    """One optimization.  Subclasses set the class attributes and implement `apply`."""

    name: str = ""
    summary: str = ""  # one line: what it does
    cost: str = ""  # one line: what it costs
    helps_when: str = ""  # one line: when it helps
    group: str = ""  # course grouping for the Lab panel: one of GROUPS (checked when the class is defined)
    kind: str = "runtime"  # one of KINDS (checked when the class is defined)
    phase: str = ""  # one of PHASES
    loops: tuple[str, ...] = ("train",)  # the loops it applies to (LOOPS)
    choices: tuple | None = None  # None: on/off; else the allowed modes, the first being the default
    gpt_only: bool = False  # changes the built-in GPT's architecture: another model needs an adapter that can
    needs_process_group: bool = False  # the run must join a process group before it is built (ddp, fsdp)
    # keeps the data-parallel ranks' copies of the model in step, averaging their gradients (ddp, fsdp, zero,
    # deepspeed): a mesh whose 'dp' dimension holds several replicas needs one of these on (replicas_in_step)
    averages_gradients: bool = False
    changes_weights: bool = False  # replaces the model's weights (quantization): never on a model in training
    # trains only a few weights it adds or picks (adapters, the head alone), the rest frozen: fine-tuning gives such
    # a run its own learning rate (scalekit.training.finetune.ADAPTER_LR)
    trains_few_weights: bool = False
    # -- what validation, the planner and autotune read of it (they name no toggle) ---------------------------
    excludes: Mapping[str, str] = {}  # toggles that cannot be on with this one -> why (declared on one side)
    requires: tuple[str, ...] = ()  # toggles of which at least one must be on with this one
    requires_why: str = ""  # why it needs one of them
    plan_note: str = ""  # what the planner says of it where it changes no tensor a step keeps ("" when `plan` models it)
    tuning: tuple[Tune, ...] = ()  # the changes autotune tries with this toggle (none: it is not searched)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        check_declared(cls)

    def available(self, hw) -> tuple[bool, str]:
        """Whether the toggle (some mode of it) can run here: (True, "") or (False, the reason in plain words)."""
        return True, ""

    def choice_available(self, hw, value: Any = True) -> tuple[bool, str]:
        """Whether this toggle can run with `value` (True for an on/off toggle, else one of its choices) here: the
        one answer every config's check_available, the CLI, the Lab and autotune ask before anything is built.  By
        default what `available` says; a toggle whose modes need different libraries or devices (quantization
        methods, optimizers, Liger's loss) answers per mode here, and nowhere else."""
        return self.available(hw)

    def available_in_ranks(self, hw) -> tuple[bool, str]:
        """What `available` would answer in each rank of a multi-process launch (the Lab and CLI launch
        toggles that need several processes); the same answer for toggles that do not."""
        return self.available(hw)

    def changes_nothing(self, cfg: Any) -> str | None:
        """Why switching this on would change nothing for the (resolved) RunConfig `cfg`, or None when it acts;
        e.g. a data toggle on data it does not touch.  Autotune does not spend time measuring such a change."""
        return None

    def applies_to(self, adapter: Any) -> tuple[bool, str]:
        """Whether it applies to a model other than the built-in GPT: `adapter` is that model's family
        (scalekit.models.family.ModelAdapter: Hugging Face's, or scalekit.models.conventions.OwnModel for a model
        of your own); (False, why) if not, `why` said of the toggle and naming the family."""
        if self.gpt_only:
            return False, (f"changes the built-in GPT and does not apply to {adapter.family}: it has no adapter that "
                           f"says how to make that change")
        return True, ""

    def choice_applies(self, adapter: Any, value: Any) -> tuple[bool, str]:
        """Whether it applies with `value` (one of its modes) to a model of family `adapter`; by default what
        `applies_to` says.  A toggle whose modes a family takes one by one (KV cache kinds) answers per mode."""
        return self.applies_to(adapter)

    def config_applies(self, config: Any, value: Any) -> tuple[bool, str]:
        """Whether it applies with `value` to this whole config, where that is known before anything is built
        (a second model it needs must read the same token ids, ...); asked by the ladders so such a rung is
        skipped with the reason instead of failing.  By default: yes."""
        return True, ""

    def validate(self, value: Any, owner: str = "RunConfig") -> Any:
        """Normalise a user's value (True, or one of `choices`); raise ConfigError naming the allowed values (and
        `owner`, the config the value was given to)."""
        if self.choices is None:
            if value is True:
                return True
            raise ConfigError(f"{owner}.toggles[{self.name!r}] is an on/off toggle: use True, got {value!r}")
        if value is True:
            return self.choices[0]
        if value in self.choices:
            return value
        allowed = ", ".join(repr(c) for c in self.choices)
        raise ConfigError(f"{owner}.toggles[{self.name!r}] must be True or one of {allowed}; got {value!r}")

    def apply(self, ctx: BuildContext, value: Any) -> None:
        raise NotImplementedError

    def mesh_dims(self, value: Any) -> dict[str, int | None]:
        """The dimensions of the run's device mesh this toggle splits the ranks along, on with `value`: {'pp': stages}
        or {'tp': degree} (scalekit.distributed.sharding.MESH_DIMS; None: every rank the other dimensions leave).  The run builds
        one mesh of every toggle's dimensions, checked against the ranks, before any toggle acts (BuildContext.mesh);
        the ranks left over form the data-parallel dimension.  By default none."""
        return {}

    def micro_batches(self, value: Any) -> int:
        """Micro-batches per optimizer step this toggle, on with `value`, splits each batch into (the batch must be
        a multiple of it: the batch-size finder steps by it); by default 1."""
        return 1

    def loaded_quantized(self, value: Any) -> dict | None:
        """How this toggle, on with `value`, has a checkpoint's weights held as transformers loads them: the keyword
        arguments of a BitsAndBytesConfig (a model read from a checkpoint folder is then quantized as it is loaded,
        never held in fp32: scalekit.hf.checkpoint_folder), or None: loaded as saved.  By default None."""
        return None

    def plan(self, facts: PlanFacts, value: Any) -> None:
        """Tell the planner what this toggle changes in a training step's memory (the fields of PlanFacts)."""

    def traced(self, value: Any) -> bool:
        """Whether the traced planner runs this toggle as it is on fake tensors (False: it is left out of the
        trace, and `plan` or `plan_note` accounts for it)."""
        return False

    @property
    def planned(self) -> bool:
        """Whether the planner models this toggle's memory: it tells the planner through `plan`, or it changes the
        architecture of the model the planner builds (the "model_config" phase of training)."""
        return type(self).plan is not Toggle.plan or (self.phase == "model_config" and "train" in self.loops)

    @property
    def explainer(self) -> str:
        """The longer explanation kept beside the toggle's module as <name>.md."""
        path = Path(inspect.getfile(type(self))).with_name(f"{self.name}.md")
        return path.read_text(encoding="utf-8") if path.exists() else self.summary

    def code(self) -> str:
        """The source of the code this toggle runs: its `apply` and the functions of its module it calls."""
        return "\n\n".join(textwrap.dedent(inspect.getsource(fn)) for fn in _called_functions(type(self)))

    def __repr__(self) -> str:
        return f"<Toggle {self.name}: {self.summary}>"

    # -- how it is spelled in the frameworks (scalekit.hf.arguments and scalekit.hf.export read these) ------------
    training_fields: Mapping[str, Any] = {}  # TrainingArguments fields it reads -> their defaults there
    # its spellings act on a Transformers model (its methods, from_config's arguments, or a TrainingArguments field
    # that calls them): the exported code of your own nn.Module does not carry it, and says so
    spelled_for_transformers_models: bool = False

    def from_training_arguments(self, fields: Mapping[str, Any], notes: list[str]) -> Any:
        """Its value for a TrainingArguments, or None (off).  `fields` holds every field of `training_fields` (at its
        default where not given) and `world_size` (the processes the Trainer runs in); what does not map exactly is
        appended to `notes`; a value the field cannot take is refused (ConfigError naming the field and what it allows)."""
        return None

    def spelling(self, target: str, value: Any, cfg: Any) -> Spelling:
        """How the toggle, on with `value`, is written in `target`'s code (one of EXPORT_TARGETS) for RunConfig `cfg`:
        what carries it, or (`missing`) why nothing can."""
        if "train" not in self.loops:
            return Spelling(missing="applies to generation (in training, to scalekit's evaluation, eval_every); the "
                                    "exported code only trains")
        return Spelling(missing=f"scalekit has no {target} spelling for this toggle")

    def off_spelling(self, target: str, cfg: Any) -> Spelling:
        """What `target`'s code says while the toggle is off, where that must be said (dataloader_num_workers=0)."""
        return Spelling()
