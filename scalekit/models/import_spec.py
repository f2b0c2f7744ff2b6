"""Code of your own named as `package.module:name` (the form of console-script entry points): the model factory,
loss_fn and batch_fn that `--model`, `--loss-fn` and `--batch-fn` name on the command line, and that
RunConfig(model="mypkg.models:make") and GenerateConfig(model=...) take from Python.

The module is imported as `python -m` would find it: the current directory is put on sys.path first (where it is
not there already), so a package in the folder you run from is found without installing it.  After the colon,
dotted attributes are allowed (`mypkg.models:Factories.small`).  Every failure is one line that names the flag
(or field) and the spec: the module is missing, importing it failed, the attribute is missing, it is no function,
or (for a model) the factory raised or returned something that is not an nn.Module.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from typing import Any

import torch

from ..errors import ConfigError

_NAME = r"[A-Za-z_]\w*"
SPEC = re.compile(rf"^({_NAME}(?:\.{_NAME})*):({_NAME}(?:\.{_NAME})*)$")


def is_import_spec(value: Any) -> bool:
    """`value` is a string `package.module:name` (no path separator, one colon, Python names on both sides)."""
    return isinstance(value, str) and SPEC.match(value) is not None


def imported(spec: str, what: str) -> Any:
    """The object `spec` ('package.module:attr.attr') names, imported; `what` names the flag or field in errors."""
    match = SPEC.match(spec) if isinstance(spec, str) else None
    if match is None:
        raise ConfigError(f"{what} {spec!r}: expected package.module:name (a module Python can import, a colon, "
                          f"then a name in it), e.g. mypkg.models:make_model")
    module_name, attrs = match.groups()
    _current_directory_on_path()
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise ConfigError(f"{what} {spec}: no module named {exc.name!r} (looked in the current directory, "
                              f"{os.getcwd()}, and sys.path)") from None
        raise ConfigError(f"{what} {spec}: importing {module_name} failed: {_said(exc)}") from None
    except Exception as exc:  # noqa: BLE001 - any failure of the user's module, said in one line
        raise ConfigError(f"{what} {spec}: importing {module_name} failed: {_said(exc)}") from None
    value: Any = module
    for depth, attr in enumerate(attrs.split(".")):
        if not hasattr(value, attr):
            owner = module_name if depth == 0 else f"{module_name}:{'.'.join(attrs.split('.')[:depth])}"
            has = [n for n, v in getattr(value, "__dict__", {}).items() if not n.startswith("_") and callable(v)][:8]
            listed = f" (its functions and classes: {', '.join(has)})" if has else ""
            raise ConfigError(f"{what} {spec}: {owner} has no attribute {attr!r}{listed}")
        value = getattr(value, attr)
    return value


def imported_function(spec: str, what: str) -> Any:
    """A function (any callable) named by `spec`: a loss_fn or batch_fn."""
    value = imported(spec, what)
    if not callable(value):
        raise ConfigError(f"{what} {spec}: is {_a(value)}, not a function")
    return value


def imported_model(spec: str, what: str) -> Any:
    """A model named by `spec`: an nn.Module, or a factory (a function or class) whose result is checked here to be
    one.  The factory is called on the meta device (shapes only: no memory, no initialisation); one that cannot
    build there is called once for real, so that a factory that fails is said now, not in the middle of a run."""
    value = imported(spec, what)
    if isinstance(value, torch.nn.Module):
        return value
    if not callable(value):
        raise ConfigError(f"{what} {spec}: is {_a(value)}, not an nn.Module or a function returning one")
    try:
        with torch.random.fork_rng(devices=[]), torch.device("meta"):
            built = value()
    except Exception:  # noqa: BLE001 - a factory that cannot build on the meta device: tried for real below
        try:
            with torch.random.fork_rng(devices=[]):
                built = value()
        except Exception as exc:  # noqa: BLE001 - the factory's own failure, said in one line
            raise ConfigError(f"{what} {spec}: the factory raised {_said(exc)}") from None
    if not isinstance(built, torch.nn.Module):
        raise ConfigError(f"{what} {spec}: the factory returned a value of type {type(built).__name__}, not a torch.nn.Module")
    return value


def _current_directory_on_path() -> None:
    """The current directory first on sys.path, as `python -m` puts it (where it is not there already)."""
    here = os.getcwd()
    if "" not in sys.path and here not in sys.path and os.path.realpath(here) not in map(_real, sys.path):
        sys.path.insert(0, here)


def _real(path: str) -> str:
    return os.path.realpath(path) if path else os.path.realpath(os.getcwd())


def _a(value: Any) -> str:
    """'an int', 'a dict': the type of `value` with its article."""
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def _said(exc: BaseException) -> str:
    """An exception in one line: its class and the first line of its message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def import_named_code(config: Any, names: tuple[str, ...]) -> None:
    """Replace each field of `config` in `names` that holds a `package.module:name` string by what it names (a
    config's validation calls this first: RunConfig(model="mypkg.models:make", loss_fn="mypkg.train:loss"))."""
    for name in names:
        value = getattr(config, name)
        if is_import_spec(value):
            what = f"{type(config).__name__}.{name}"
            setattr(config, name, imported_model(value, what) if name == "model" else imported_function(value, what))
