"""The command line's flags, derived from the config dataclasses: a field `warmup_steps: int = 3` with a docstring
becomes `--warmup-steps` (type int, default 3, help the docstring).  The tables below name what does not follow
that rule, each entry with its reason; tests/cli/test_cli_from_config.py fails on a field with no flag or a flag with
no field that is not in them."""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
from typing import NamedTuple

# A field's flag is --field-name, unless spelled otherwise here (the parser still derives it from the field)
FLAG_ALIASES = {
    "RunConfig.check_memory": ("--no-memory-check", "its spelling since the first release; the README and tests "
                                                    "use it (derived, it would be --no-check-memory)"),
}

# Fields whose flags the command line declares itself: their conversion is no field type's, with why
DECLARED_IN_CLI = {
    "RunConfig.toggles": (("--toggle",), "NAME[=MODE], one toggle per flag, repeatable; each command says which "
                                         "toggles it takes"),
    "GenerateConfig.toggles": (("--toggle",), "as RunConfig.toggles"),
    "RunConfig.model": (("--hf-model", "--model"), "the field takes a Python object; --hf-model names a Hugging Face "
                        "family built offline in --preset's shape, --model your package's factory (pkg.module:name)"),
    "RunConfig.batch_fn": (("--batch-fn",), "a function of your package, named pkg.module:name and imported"),
    "RunConfig.loss_fn": (("--loss-fn",), "a function of your package, named pkg.module:name and imported"),
    "GenerateConfig.model": (("--model", "--hf-model"), "the field takes a name or a Python object; --model takes "
                             "a name (unset: --preset chooses in the ladders) or your package's factory "
                             "(pkg.module:name), --hf-model a Hugging Face family"),
    "GenerateConfig.prompts": (("--prompt",), "one prompt per flag, repeatable: a batch of prompts"),
}

# Fields that have no flag, and flags (or whole commands) that set no field: each with why
NO_COUNTERPART = {
    "RunConfig.dataset": "a Python object, a torch or Hugging Face Dataset",
    "RunConfig.collate_fn": "a Python function, the DataLoader's",
    "RunConfig.tokens_per_sample": "counts the tokens of your own model's samples; the command line's models (the "
                                   "built-in GPT, --hf-model) count their own",
    "RunConfig.adapter_targets": "layer names of your own model's code, a list: set from Python with the model",
    "RunConfig.notes": "what RunConfig.from_training_arguments said when it made the config; never given",
    "RunConfig.label": "the commands name their rows themselves (from the toggles; a ladder by its rungs)",
    "GenerateConfig.quality_tokens": "held-out token ids, a tensor or list: from Python",
    "GenerateConfig.tokenizer": "a Python object with encode and decode",
    "GenerateConfig.label": "as RunConfig.label",
    "--json": "where the results are written, not what is run",
    "--repeats": "how many times a ladder measures each row, not one run's config",
    "--nproc-per-node": "how many processes run the config, not the config",
    "--timeout-s": "when launched processes are stopped, not what they run",
    "--world-size": "the processes the exported framework code runs in",
    "--budget-mb": "the search's memory budget (scalekit tune), not one run's",
    "--time-budget-s": "the search's time budget (scalekit tune)",
    "--run-steps": "the length of the real run a search plans for (scalekit tune)",
    "--generate": "picks tune's loop (generation), not a field",
    "--export": "prints tune's winner as code",
    "scalekit launch": "starts a script in processes; builds no config (its flags are torchrun's)",
    "scalekit doctor": "reports the machine; builds no config",
    "scalekit predict": "predicts for GPUs that are not here (scalekit.predict); builds no config",
    "scalekit plan-for": "ranks plans for GPUs that are not here (scalekit.plan_for); builds no config",
}


class FieldFlag(NamedTuple):
    """One field's flag: what argparse's add_argument is given for it."""

    name: str  # "RunConfig.steps"
    flag: str  # "--steps"
    options: dict  # add_argument's keywords: dest, type or action, default, help


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Each field's docstring (the string right after it in the class body), its whitespace made single spaces."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    docs = {}
    for node, after in zip(body, body[1:], strict=False):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) \
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) \
                and isinstance(after.value.value, str):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


# a field's annotation (as written, with `from __future__ import annotations`) -> the flag's conversion
SCALAR_TYPES = {"int": int, "float": float, "str": str, "bool": bool}
METAVARS = {int: "N", float: "X"}  # a text flag's placeholder is its name: --device DEVICE


def _scalar_type(cls: type, f: dataclasses.Field) -> type:
    parts = [p.strip() for p in str(f.type).split("|") if p.strip() != "None"]
    if len(parts) != 1 or parts[0] not in SCALAR_TYPES:
        raise TypeError(f"{cls.__name__}.{f.name}: no flag can be derived from its type {f.type!r}: list it in "
                        f"scalekit/cli/fields.py's DECLARED_IN_CLI or NO_COUNTERPART, with the reason")
    return SCALAR_TYPES[parts[0]]


def field_flag(cls: type, field_name: str, help_prefix: str = "") -> FieldFlag:
    """The flag of field `field_name` of dataclass `cls`: its spelling, conversion, default and help."""
    f = next(f for f in dataclasses.fields(cls) if f.name == field_name)
    name = f"{cls.__name__}.{f.name}"
    doc = field_docs(cls).get(f.name)
    if not doc:
        raise TypeError(f"{name} has no docstring, which its flag's help would be")
    kind = _scalar_type(cls, f)
    help_text = help_prefix + doc.replace("%", "%%")
    dashed = f.name.replace("_", "-")
    if kind is bool:  # a switch that turns the field away from its default
        flag = f"--no-{dashed}" if f.default else f"--{dashed}"
        options = dict(action="store_false" if f.default else "store_true",
                       help=f"{help_text} (default: {'on' if f.default else 'off'}; this flag turns it "
                            f"{'off' if f.default else 'on'})")
    else:
        flag = f"--{dashed}"
        default = f" (default: {f.default})" if f.default is not None else ""
        options = dict(type=kind, metavar=METAVARS.get(kind, dashed.upper()), help=help_text + default)
    flag = FLAG_ALIASES.get(name, (flag,))[0]
    return FieldFlag(name, flag, dict(options, dest=f.name, default=f.default))


def derived_fields(cls: type) -> tuple[str, ...]:
    """The fields of `cls` whose flags are derived: all but those declared by hand or without a flag."""
    return tuple(f.name for f in dataclasses.fields(cls)
                 if f"{cls.__name__}.{f.name}" not in DECLARED_IN_CLI
                 and f"{cls.__name__}.{f.name}" not in NO_COUNTERPART)


def field_flags(cls: type, names: tuple[str, ...] | None = None, help_prefix: str = "") -> list[FieldFlag]:
    """The derived flags of `cls`'s fields `names` (default: every derived field), in the fields' order."""
    return [field_flag(cls, name, help_prefix) for name in (derived_fields(cls) if names is None else names)]


def add_field_flags(p, cls: type, names: tuple[str, ...] | None = None, help_prefix: str = "") -> None:
    for spec in field_flags(cls, names, help_prefix):
        p.add_argument(spec.flag, **spec.options)


def flags_of(cls: type) -> dict[str, tuple[str, ...]]:
    """{field: its flags} for config class `cls`, derived or declared (error messages name the flag)."""
    out = {spec.name.split(".")[1]: (spec.flag,) for spec in field_flags(cls)}
    for name, (flags, _) in DECLARED_IN_CLI.items():
        owner, _, field_name = name.partition(".")
        if owner == cls.__name__:
            out[field_name] = flags
    return out


def given_fields(args, cls: type, names: tuple[str, ...] | None = None) -> dict:
    """{field: the parsed value} of `cls`'s derived fields `names` (default: all of them), for cls(**...)."""
    return {name: getattr(args, name) for name in (derived_fields(cls) if names is None else names)}


def changed_flags(args, cls: type, names: tuple[str, ...]) -> list[str]:
    """Of `cls`'s derived fields `names`, the flags given a value other than the field's default."""
    return [spec.flag for spec in field_flags(cls, names)
            if getattr(args, spec.options["dest"]) != spec.options["default"]]
