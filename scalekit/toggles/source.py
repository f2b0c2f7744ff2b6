"""The code a toggle shows (Toggle.code): its `apply` and the functions of its module it calls, found by reading
their source, with the functions of the layers below the toggles (models/, data/) those call, one level deep."""

from __future__ import annotations

import ast
import inspect
import textwrap


def _called_functions(cls: type) -> list:
    """cls.apply, then every function (or class) of its module that it calls, directly or through them, and the
    functions of scalekit's lower layers (models/, data/) those call, one level deep: the code the toggle runs."""
    module = inspect.getmodule(cls)
    seen: list = []
    todo = [cls.apply]
    while todo:
        fn = todo.pop(0)
        if fn in seen:
            continue
        seen.append(fn)
        home = inspect.getmodule(fn)
        if home is not module:
            continue  # a lower layer's function is shown, not followed further
        for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(fn)))):
            called = node.func if isinstance(node, ast.Call) else None
            target = getattr(home, called.id, None) if isinstance(called, ast.Name) else None
            if target is not None and _shown(inspect.getmodule(target), module) and \
                    (inspect.isfunction(target) or inspect.isclass(target)):
                todo.append(target)
    return seen


def _shown(where, module) -> bool:
    """A function of the toggle's own module, or of the layers below the toggles that do a toggle's work."""
    name = getattr(where, "__name__", "")
    return where is module or name.startswith(("scalekit.models.", "scalekit.data."))
