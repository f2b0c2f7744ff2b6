"""Every optimization scalekit can switch, and the one function that fixes the order they apply in."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError
from . import (
    activation_offload,
    bf16,
    checkpointing,
    chunked_cross_entropy,
    compile,
    cpu_offload,
    data_echo,
    dataloader_num_workers,
    dataloader_pin_memory,
    ddp,
    deepspeed,
    dora,
    drop_last,
    empty_cache_steps,
    float8,
    fp16,
    fsdp,
    fused_adamw,
    grad_accum,
    head_only,
    inference_mode,
    kv_cache,
    liger_kernels,
    lora,
    nice_numbers,
    non_blocking,
    optim,
    pipeline_parallel,
    qat,
    quantize,
    quantized_base,
    sdpa,
    sequence_packing,
    speculative,
    tensor_parallel,
    tf32,
    training_format,
    vectorized_transforms,
    zero,
)
from .base import BuildContext, Spelling, Toggle, Tune
from .facts import PlanFacts
from .stepper import OptimizerStep
from .vocabulary import GROUPS, KINDS, LOOPS, PHASES

# Application order (after torchtitan), phase by phase (vocabulary.PHASES): process-wide flags first; then the
# precision the run computes in, which the wrappers below read; then the data pipeline; then changes to the
# model's architecture, made before it is built; then module swaps on the built model (fine-tuning freezes
# the base, quantizes it and adds adapters; optim's StableEmbedding) and wrappers, innermost first (activation
# checkpointing, then compile, then DDP/FSDP, so the wrapper that shards sees compiled blocks; cpu_offload is
# a policy fsdp reads, so it comes just before it); then the optimizer, which must see the final parameters;
# last the per-step behaviour (accumulation, hooks after each step, and DeepSpeed, which takes over the model
# and optimizer built above).  Generation walks the same phases (loop="generate") with the toggles that apply
# to it: kv_cache chooses the cache the decode loop makes (the loop, not compile, reads it); quantize swaps
# the blocks' linear layers before compile wraps the model; inference_mode is the context the loop runs in.
# A toggle added by register() goes last in its phase, or after the toggle it names.
ORDER: list[Toggle] = [
    tf32.TOGGLE,
    bf16.TOGGLE,
    fp16.TOGGLE,
    drop_last.TOGGLE,
    training_format.TOGGLE,
    vectorized_transforms.TOGGLE,
    dataloader_num_workers.TOGGLE,
    dataloader_pin_memory.TOGGLE,
    non_blocking.TOGGLE,
    data_echo.TOGGLE,
    sequence_packing.TOGGLE,
    sdpa.TOGGLE,
    nice_numbers.TOGGLE,
    chunked_cross_entropy.TOGGLE,
    kv_cache.TOGGLE,
    head_only.TOGGLE,
    quantized_base.TOGGLE,
    lora.TOGGLE,
    dora.TOGGLE,
    optim.TOGGLE,
    qat.TOGGLE,
    float8.TOGGLE,
    liger_kernels.TOGGLE,
    quantize.TOGGLE,
    checkpointing.TOGGLE,
    activation_offload.TOGGLE,
    compile.TOGGLE,
    speculative.TOGGLE,
    ddp.TOGGLE,
    pipeline_parallel.TOGGLE,  # torchtitan's order: the stages first, then tensor parallelism on their blocks,
    tensor_parallel.TOGGLE,  # then fsdp over the data-parallel dimension (one mesh: parallel.mesh_shape)
    cpu_offload.TOGGLE,
    fsdp.TOGGLE,
    zero.TOGGLE,
    fused_adamw.TOGGLE,
    grad_accum.TOGGLE,
    empty_cache_steps.TOGGLE,
    inference_mode.TOGGLE,
    deepspeed.TOGGLE,
]
TOGGLES: dict[str, Toggle] = {t.name: t for t in ORDER}  # by name, in ORDER; both kept in step by register()


def check_registrable(toggle: Any) -> None:
    """Refuse (ConfigError) what is not a Toggle with a name, a phase and a group: what a subclass sets is checked
    when it is defined (vocabulary.check_declared); this catches what it leaves unset."""
    if not isinstance(toggle, Toggle) or not toggle.name or toggle.phase not in PHASES:
        raise ConfigError(f"register: a Toggle with a name and a phase (one of {', '.join(PHASES)}) is needed, "
                          f"got {toggle!r}")
    if toggle.group not in GROUPS:
        raise ConfigError(f"register: toggle {toggle.name!r} has group={toggle.group!r}; it must be one of "
                          f"{', '.join(map(repr, GROUPS))}")


for _toggle in ORDER:
    check_registrable(_toggle)


def register(toggle: Toggle, after: str | None = None) -> Toggle:
    """Add `toggle` to ORDER and TOGGLES (after the toggle named `after`, else last of its phase), so every part
    of scalekit that reads them (validation, the Lab, the CLI, the planner, exports, autotune) sees it."""
    check_registrable(toggle)
    if toggle.name in TOGGLES:
        raise ConfigError(f"register: a toggle named {toggle.name!r} exists already")
    if after is not None:
        if after not in TOGGLES or TOGGLES[after].phase != toggle.phase:
            raise ConfigError(f"register: after={after!r} must name a toggle of the {toggle.phase!r} phase")
        at = ORDER.index(TOGGLES[after]) + 1
    else:
        at = sum(1 for t in ORDER if PHASES.index(t.phase) <= PHASES.index(toggle.phase))
    ORDER.insert(at, toggle)
    _reindex()
    return toggle


def unregister(name: str) -> None:
    """Remove a toggle that register() added (tests, plug-ins)."""
    ORDER.remove(TOGGLES[name])
    _reindex()


def _reindex() -> None:
    TOGGLES.clear()  # in place: every module that imported TOGGLES sees the change
    TOGGLES.update((t.name, t) for t in ORDER)


def exclusions() -> list[tuple[str, str, str]]:
    """(a, b, why) for every pair of toggles that cannot be on together, as the toggles declare them."""
    return [(other, t.name, why) for t in ORDER for other, why in t.excludes.items()]


def requirements() -> list[tuple[str, tuple[str, ...], str]]:
    """(toggle, the toggles of which one must be on with it, why)."""
    return [(t.name, t.requires, t.requires_why) for t in ORDER if t.requires]


def normalise(toggles: Any, owner: str = "RunConfig", loop: str | None = None) -> dict[str, Any]:
    """Names, or {name: value}, as {name: validated value} in application order; "off" (False, None) left out.
    With `loop`, a toggle that does not act in that loop is refused, naming the toggles that do."""
    if isinstance(toggles, str):
        toggles = [toggles]
    if isinstance(toggles, Mapping):
        items = list(toggles.items())
    elif isinstance(toggles, (list, tuple, set, frozenset)):
        items = [(name, True) for name in toggles]
    else:
        raise ConfigError(f"{owner}.toggles must be a list of toggle names or a {{name: value}} dict, "
                          f"got {type(toggles).__name__}")
    chosen: dict[str, Any] = {}
    named: set[str] = set()
    for name, value in items:
        if not isinstance(name, str) or name not in TOGGLES:
            raise ConfigError(f"{owner}.toggles: unknown toggle {name!r}; allowed: {', '.join(TOGGLES)}")
        if name in named:  # a list can name a toggle twice; a dict cannot
            raise ConfigError(f"{owner}.toggles: {name!r} is given twice: give each toggle once")
        named.add(name)
        if loop is not None and loop not in TOGGLES[name].loops:
            acting = ", ".join(t.name for t in ORDER if loop in t.loops)
            raise ConfigError(f"{owner}.toggles: {name!r} applies to {' and '.join(LOOP_WORDS[x] for x in TOGGLES[name].loops)}, not to "
                              f"{LOOP_WORDS[loop]}; {LOOP_WORDS[loop]} toggles: {acting}")
        if value is False or value is None:
            continue  # "off" is simply not building it in
        chosen[name] = TOGGLES[name].validate(value, owner)
    return {t.name: chosen[t.name] for t in ORDER if t.name in chosen}


LOOP_WORDS = {"train": "training", "generate": "generation"}


def check_combination(toggles, owner: str = "RunConfig") -> None:
    """Refuse (ConfigError) toggles that exclude each other, or one without a toggle it needs; `owner` names
    the config in the message (RunConfig, GenerateConfig)."""
    for a, b, why in exclusions():
        if a in toggles and b in toggles:
            raise ConfigError(f"{owner}.toggles: {a!r} and {b!r} cannot be on together: {why}")
    for a, needs, why in requirements():
        if a in toggles and not any(b in toggles for b in needs):
            said = " or ".join(repr(b) for b in needs)
            raise ConfigError(f"{owner}.toggles: {a!r} needs {said} on too: {why}")


def apply_toggles(ctx: BuildContext, phase: str, toggles: dict, loop: str = "train") -> None:
    """Apply the chosen `toggles` that act at `phase` in `loop`, in ORDER; one that says it changes nothing for
    this configuration (Toggle.changes_nothing) is not applied, and the run's notes say why."""
    assert phase in PHASES, phase
    for toggle in ORDER:
        if toggle.phase == phase and toggle.name in toggles and loop in toggle.loops:
            nothing = toggle.changes_nothing(ctx.config)
            if nothing:
                ctx.notes.append(nothing)
                continue
            toggle.apply(ctx, toggles[toggle.name])


def mesh_dims(toggles: dict) -> dict[str, int | None]:
    """The device mesh's dimensions the chosen `toggles` declare (Toggle.mesh_dims), each declared by one toggle."""
    dims: dict[str, int | None] = {}
    for name, value in toggles.items():
        for dim, size in TOGGLES[name].mesh_dims(value).items():
            if dim in dims:
                raise ConfigError(f"toggles: two toggles split the ranks along the mesh's {dim!r} dimension; "
                                  f"{name!r} is the second")
            dims[dim] = size
    return dims


def replicas_in_step(toggles: dict, shape: tuple[int, int, int], world: int) -> None:
    """Refuse (ConfigError, naming the numbers) a mesh of `shape` (pipeline stages, data-parallel ranks, tensor-parallel
    degree: sharding.mesh_shape) over `world` ranks whose data-parallel dimension holds several copies of the model
    while none of `toggles` averages their gradients (Toggle.averages_gradients): each copy would train on its share
    of the batch alone and drift from the others, so the run's figures would not be one model's."""
    pp, dp, tp = shape
    if dp == 1 or any(TOGGLES[name].averages_gradients for name in toggles):
        return
    sizes = " × ".join(f"{name}={toggles[name]}" for name in toggles if TOGGLES[name].mesh_dims(toggles[name]))
    barred = {b for a, b, _ in exclusions() if a in toggles} | {a for a, b, _ in exclusions() if b in toggles}
    averaging = [t.name for t in ORDER if t.averages_gradients and t.name not in barred]
    instead = f"turn {averaging[0]}{f' (or {averaging[1]})' if len(averaging) > 1 else ''} on too, or " \
        if averaging else ""
    raise ConfigError(f"{sizes} on {world} ranks leaves {dp} data-parallel replicas that nothing keeps in step (each "
                      f"trains on its share of the batch, their gradients never averaged): {instead}launch "
                      f"{pp * tp} ranks")


def plan_facts(toggles: dict, world_size: int = 1, mesh: tuple[int, int, int] | None = None) -> PlanFacts:
    """What `toggles` change in a training step, as each says it (Toggle.plan), for a run over `world_size` ranks
    laid out as `mesh` (pipeline stages, data-parallel ranks, tensor-parallel degree: parallel.mesh_shape)."""
    facts = PlanFacts(world_size=world_size)
    if mesh is not None:
        facts.pipeline_stages, _, facts.tensor_parallel = mesh
    for name, value in toggles.items():
        TOGGLES[name].plan(facts, value)
    return facts


def needs_process_group(toggles) -> bool:
    """Whether any of `toggles` (names) needs the run to join a process group before it is built."""
    return any(TOGGLES[name].needs_process_group for name in toggles)


__all__ = ["ORDER", "TOGGLES", "register", "unregister", "normalise", "exclusions", "requirements", "check_combination", "plan_facts",
           "mesh_dims", "replicas_in_step",
           "apply_toggles", "needs_process_group", "Toggle", "Tune", "PlanFacts", "Spelling", "BuildContext",
           "OptimizerStep", "PHASES", "LOOPS", "LOOP_WORDS", "GROUPS", "KINDS"]
