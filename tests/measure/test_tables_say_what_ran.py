"""Every table a result reaches says what the run measured beside its figures: a compile that captured no graph is
flagged (the row measured eager code under compile's label), and the attention kernels SDPA ran are named.  The text
tables, compare(), and both Labs' tables, training and generation."""

from __future__ import annotations

import dataclasses

from scalekit.inference.report import generation_table
from scalekit.training.report import results_table
from scalekit.widgets.generate_table import results_frame as generation_frame
from scalekit.widgets.generate_table import results_html as generation_html
from scalekit.widgets.table import results_frame, results_html
from tests.helpers import scripted_generation, scripted_result


def runs():
    base = scripted_result("baseline", [10.0, 10.2, 9.9, 10.1], busy=False)
    compiled = dataclasses.replace(scripted_result("+ compile", [9.0, 9.1, 8.9, 9.2], busy=False),
                                   graphs_compiled=0, sdpa_backends={"math": 4, "flash": 8})
    return [base, compiled]


def generations():
    base = scripted_generation("baseline", [1.0, 1.1, 0.9, 1.0], busy=False)
    compiled = dataclasses.replace(scripted_generation("+ compile", [0.9, 1.0, 0.8, 0.9], busy=False),
                                   graphs_compiled=0, sdpa_backends={"flash": 12})
    return [base, compiled]


def test_the_training_tables_flag_a_compile_that_did_nothing_and_name_the_kernels():
    frame = results_frame(list(enumerate(runs(), 1)))
    assert list(frame["flags"]) == ["", "compile no-op"]
    assert frame.loc[1, "sdpa"] == "flash ×8, math ×4"
    page = results_html(frame)
    assert "compile no-op" in page and "attention kernels" in page and "flash ×8, math ×4" in page
    assert "COMPILE NO-OP" in results_table(runs())


def test_the_generation_tables_flag_a_compile_that_did_nothing_and_name_the_kernels():
    frame = generation_frame(list(enumerate(generations(), 1)))
    assert list(frame["flags"]) == ["", "compile no-op"]
    assert frame.loc[1, "sdpa"] == "flash ×12"
    page = generation_html(frame)
    assert "compile no-op" in page and "flash ×12" in page
    text = generation_table(generations()).splitlines()
    assert "COMPILE NO-OP" in next(line for line in text if line.startswith("+ compile"))
    assert "COMPILE NO-OP" not in next(line for line in text if line.startswith("baseline"))
