"""Strip outputs, execution counts and widget state from notebooks, so they are committed clean.

    python tools/strip_notebooks.py                 # strip every notebook under notebooks/ in place
    python tools/strip_notebooks.py --check         # list notebooks that are not clean; exit 1 if any
    python tools/strip_notebooks.py a.ipynb b.ipynb # only these

An executed course notebook carries megabytes of plotly.js and widget state; the sources need none of it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CELL_METADATA_DROPPED = ("execution", "collapsed", "scrolled", "ExecuteTime")
NOTEBOOK_METADATA_DROPPED = ("widgets",)


def problems(nb: dict) -> list[str]:
    """What keeps `nb` (parsed JSON) from being clean, one line each."""
    found = [f"notebook metadata has {key!r}" for key in NOTEBOOK_METADATA_DROPPED if key in nb.get("metadata", {})]
    for i, cell in enumerate(nb.get("cells", [])):
        if cell.get("cell_type") != "code":
            continue
        if cell.get("outputs"):
            found.append(f"cell {i} has {len(cell['outputs'])} output(s)")
        if cell.get("execution_count") is not None:
            found.append(f"cell {i} has execution_count {cell['execution_count']}")
        found += [f"cell {i} metadata has {key!r}" for key in CELL_METADATA_DROPPED if key in cell.get("metadata", {})]
    return found


def strip(nb: dict) -> dict:
    for key in NOTEBOOK_METADATA_DROPPED:
        nb.get("metadata", {}).pop(key, None)
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
        for key in CELL_METADATA_DROPPED:
            cell.get("metadata", {}).pop(key, None)
    return nb


def write(nb: dict, path: Path) -> None:
    # the layout nbformat and JupyterLab write: one-space indent, sorted keys, UTF-8, final newline
    path.write_text(json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=Path, help="notebooks (default: every .ipynb under notebooks/, solutions included)")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a notebook is not clean")
    args = parser.parse_args(argv)
    paths = args.paths or sorted(p for p in (ROOT / "notebooks").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
    dirty = 0
    for path in paths:
        nb = json.loads(path.read_text(encoding="utf-8"))
        found = problems(nb)
        if not found:
            continue
        dirty += 1
        if args.check:
            print(f"{path}: " + "; ".join(found))
        else:
            write(strip(nb), path)
            print(f"stripped {path}")
    return 1 if args.check and dirty else 0


if __name__ == "__main__":
    sys.exit(main())
