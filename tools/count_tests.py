"""Count the test functions and assertions of a tests directory, so that a reorganisation can show it lost none.

    python tools/count_tests.py [tests] [--by-folder]

A test function is a `def test_*` (or `async def`) at a module's top level or in a `Test*` class; an assertion
is an `assert` statement or a `with pytest.raises(...)` / `with pytest.warns(...)` (also as a call).  Every
`*.py` file under the directory is read with `ast`; nothing is imported or run.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

CHECKERS = ("raises", "warns")


def _is_checker(node: ast.AST) -> bool:
    """`pytest.raises(...)` / `pytest.warns(...)` (or the bare names, imported from pytest)."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr in CHECKERS and isinstance(func.value, ast.Name) and func.value.id == "pytest"
    return isinstance(func, ast.Name) and func.id in CHECKERS


def count_file(path: Path) -> tuple[int, int]:
    """(test functions, assertions) of one file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    tests = 0
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            tests += 1
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            tests += sum(1 for item in node.body
                         if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name.startswith("test"))
    assertions = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert):
            assertions += 1
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            assertions += sum(1 for item in node.items if _is_checker(item.context_expr))
        elif isinstance(node, ast.Expr) and _is_checker(node.value):
            assertions += 1  # pytest.raises(Error, function, *args) as a statement
    return tests, assertions


def count(folder: Path) -> tuple[int, int, int]:
    """(files, test functions, assertions) of every `*.py` file under `folder`."""
    files = sorted(folder.rglob("*.py"))
    totals = [count_file(path) for path in files]
    return len(files), sum(t for t, _ in totals), sum(a for _, a in totals)


def main(argv: list[str]) -> int:
    args = [a for a in argv[1:] if a != "--by-folder"]
    folder = Path(args[0] if args else "tests")
    if "--by-folder" in argv:  # each folder directly under `folder`, then the files at its root
        for sub in sorted(p for p in folder.iterdir() if p.is_dir() and any(p.rglob("*.py"))):
            files, tests, assertions = count(sub)
            print(f"{sub}: {files} files, {tests} test functions, {assertions} assertions")
    files, tests, assertions = count(folder)
    print(f"{folder}: {files} files, {tests} test functions, {assertions} assertions")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
