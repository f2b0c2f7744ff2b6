"""Course notebooks are committed without outputs, execution counts or widget state."""

import json
from pathlib import Path

import pytest

from tests.helpers import load_tool

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted(p for p in (ROOT / "notebooks").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)




def _dirt(nb: dict) -> list[str]:
    # checked here directly, not through the tool, so a bug in the tool cannot hide a dirty notebook
    found = ["widget state"] if "widgets" in nb.get("metadata", {}) else []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "code":
            if cell.get("outputs"):
                found.append(f"cell {i}: outputs")
            if cell.get("execution_count") is not None:
                found.append(f"cell {i}: execution_count")
    return found


def test_there_are_course_notebooks():
    assert NOTEBOOKS, "notebooks/ holds no .ipynb"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_is_committed_clean(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    dirt = _dirt(nb)
    assert not dirt, f"{path.name} is not clean ({', '.join(dirt)}): run python tools/strip_notebooks.py"


def test_strip_tool_cleans_an_executed_notebook(tmp_path):
    tool = load_tool("strip_notebooks")
    nb = {
        "cells": [
            {"cell_type": "markdown", "metadata": {}, "source": "# title"},
            {"cell_type": "code", "execution_count": 3, "metadata": {"execution": {"t": 1}, "tags": ["keep"]},
             "outputs": [{"output_type": "stream", "name": "stdout", "text": "hi\n"}], "source": "print('hi')"},
        ],
        "metadata": {"widgets": {"state": {}}, "kernelspec": {"name": "python3"}},
        "nbformat": 4, "nbformat_minor": 5,
    }
    path = tmp_path / "dirty.ipynb"
    path.write_text(json.dumps(nb))
    assert _dirt(nb) and tool.problems(nb)
    assert tool.main(["--check", str(path)]) == 1
    assert tool.main([str(path)]) == 0
    cleaned = json.loads(path.read_text())
    assert _dirt(cleaned) == [] and tool.problems(cleaned) == []
    assert tool.main(["--check", str(path)]) == 0
    # what matters is kept: sources, tags, kernelspec
    assert cleaned["cells"][1]["source"] == "print('hi')"
    assert cleaned["cells"][1]["metadata"] == {"tags": ["keep"]}
    assert cleaned["metadata"] == {"kernelspec": {"name": "python3"}}
