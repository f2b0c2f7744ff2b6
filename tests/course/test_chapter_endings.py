"""Every chapter ends as the course's second edition asks: a "What you measured" cell built from
the reader's results, then an Exercises cell whose link names a solutions notebook that exists; the first code
cell calls setup_page() and no chapter pins torch's threads itself."""

import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
CHAPTERS = sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb"))


def cells(stem):
    nb = json.loads((NOTEBOOKS / f"{stem}.ipynb").read_text(encoding="utf-8"))
    return [(c["cell_type"], "".join(c["source"])) for c in nb["cells"]]


@pytest.mark.parametrize("stem", CHAPTERS)
def test_a_chapter_ends_with_what_you_measured_and_exercises_with_solutions(stem):
    found = cells(stem)
    summary = [i for i, (kind, src) in enumerate(found) if kind == "code" and "what_you_measured(" in src]
    exercises = [i for i, (kind, src) in enumerate(found) if kind == "markdown" and "## Exercises" in src]
    assert summary and exercises and summary[-1] < exercises[-1], stem
    source = found[summary[-1]][1]
    assert "finding(" in source or "{" in source  # the reader's own results: findings, or figures filled in
    links = re.findall(r"\((solutions/[^)]+\.ipynb)\)", found[exercises[-1]][1])
    assert links == [f"solutions/{stem}_solutions.ipynb"], links
    assert (NOTEBOOKS / links[0]).is_file()
    numbered = [line for line in found[exercises[-1]][1].splitlines() if re.match(r"\d\. ", line)]
    assert 2 <= len(numbered) <= 3


@pytest.mark.parametrize("stem", CHAPTERS)
def test_a_chapter_sets_up_its_page_and_leaves_threads_to_the_run(stem):
    code = [src for kind, src in cells(stem) if kind == "code"]
    assert "setup_page()" in code[0]
    assert not any("setup_plots" in src for src in code)
    # a chapter's own code leaves torch's threads to the run; a process it starts by hand may set its own
    top_level = [line for src in code for line in src.splitlines() if not line.startswith((" ", "\t"))]
    assert not any("set_num_threads" in line for line in top_level)
