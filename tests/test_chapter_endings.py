"""Chapters 07, 08, 10, 11 and 13 end as the course's second edition asks: a "What you measured" cell built from
the reader's results, then an Exercises cell whose link names a solutions notebook that exists; the first code
cell calls setup_page() and no chapter pins torch's threads itself."""

import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
CHAPTERS = ["07_memory", "08_optimizers", "10_ddp", "11_fsdp", "13_parallelism"]


def cells(stem):
    nb = json.loads((NOTEBOOKS / f"{stem}.ipynb").read_text(encoding="utf-8"))
    return [(c["cell_type"], "".join(c["source"])) for c in nb["cells"]]


@pytest.mark.parametrize("stem", CHAPTERS)
def test_a_chapter_ends_with_what_you_measured_and_exercises_with_solutions(stem):
    found = cells(stem)
    summary = [i for i, (kind, src) in enumerate(found) if kind == "code" and "what_you_measured(" in src]
    exercises = [i for i, (kind, src) in enumerate(found) if kind == "markdown" and src.startswith("## Exercises")]
    assert summary and exercises and summary[-1] < exercises[-1], stem
    assert "finding(" in found[summary[-1]][1] or "sentence" in found[summary[-1]][1]  # the reader's own results
    links = re.findall(r"\((solutions/[^)]+\.ipynb)\)", found[exercises[-1]][1])
    assert links == [f"solutions/{stem}_solutions.ipynb"], links
    assert (NOTEBOOKS / links[0]).is_file()
    numbered = [line for line in found[exercises[-1]][1].splitlines() if re.match(r"\d\. ", line)]
    assert 2 <= len(numbered) <= 3


@pytest.mark.parametrize("stem", CHAPTERS)
def test_a_chapter_sets_up_its_page_and_leaves_threads_to_the_run(stem):
    code = [src for kind, src in cells(stem) if kind == "code"]
    assert "setup_page()" in code[0]
    assert not any("set_num_threads" in src or "setup_plots" in src for src in code)
