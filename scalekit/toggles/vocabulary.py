"""The registry's vocabulary: the phases a run is built in, the kinds of saving, the loops and the course's groups
a toggle may name, and the check that refuses a Toggle class naming anything else when it is defined (at import).

PHASES is also the order the engine builds a run in (scalekit.training.build walks the tuple); GROUPS is the order of
the Lab's headings.  scalekit.toggles.base.Toggle calls `check_declared` for every subclass.
"""

from __future__ import annotations

from ..errors import ConfigError

# The phases of a build, in the order the engine runs them.  After the toggles of a phase, the engine
# builds what that phase is for (training.BUILDERS): after "data" the batches, after "model_config" the
# model, after "optimizer" the optimizer and its stepper.
PHASES = (
    "process",  # process-wide flags (TF32), undone through the run's exit stack
    "precision",  # the dtypes the run computes in: read by the wrappers of the "wrap" phase
    "data",  # the input pipeline's options
    "model_config",  # changes to the built-in GPT's architecture, made before it is built
    "wrap",  # module swaps and wrappers on the built model, innermost first
    "optimizer",  # the optimizer's choice and options, before it is built over the final parameters
    "step",  # per-step behaviour: accumulation, hooks after each step, engines that own the step
)
KINDS = ("runtime", "memory", "both")  # what a toggle saves: step time, memory, or both
LOOPS = ("train", "generate")  # the loops a toggle can apply to
# The course's groups: the Lab shows one heading per group, in the order its toggles first appear in ORDER.
GROUPS = (
    "precision",  # the dtypes matmuls and weights compute in
    "data",  # the input pipeline
    "kernels",  # which kernels run the same maths
    "shapes",  # sizes that suit the hardware's tiles
    "memory",  # levers that trade time for memory
    "finetune",  # training a few new or chosen weights of a pretrained model
    "optimizer",  # the optimizer and how it steps
    "compile",  # torch.compile
    "distributed",  # several processes: data, tensor and pipeline parallelism, sharding
    "inference",  # generation
)


# class attribute -> the values it may take; a subclass that sets one to anything else fails when it is defined
DECLARED_VALUES = {"group": GROUPS, "kind": KINDS, "phase": PHASES}


def check_declared(cls: type) -> None:
    """Refuse (ConfigError) a Toggle class that sets `group`, `kind` or `phase` to a value outside its tuple, or
    `loops` to anything but LOOPS' members, naming the toggle, the field and the allowed values."""
    who = f"toggle {cls.__dict__['name']!r}" if cls.__dict__.get("name") else f"Toggle subclass {cls.__name__}"
    for field_name, allowed in DECLARED_VALUES.items():
        if field_name in cls.__dict__ and cls.__dict__[field_name] not in allowed:
            raise ConfigError(f"{who}: {field_name}={cls.__dict__[field_name]!r} is not one of "
                              f"{', '.join(map(repr, allowed))}")
    loops = cls.__dict__.get("loops", LOOPS)
    if not loops or any(loop not in LOOPS for loop in loops):
        raise ConfigError(f"{who}: loops={loops!r} must name one or more of {', '.join(map(repr, LOOPS))}")
