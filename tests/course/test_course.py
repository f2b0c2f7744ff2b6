"""The helpers every chapter shares: its tables, its sentences, its summary, its code blocks and its quiet page."""

import warnings

import pytest

from scalekit import RunConfig, run
from scalekit.course import chapter as course
from scalekit.measure.stats import BUSY_VERDICT


@pytest.fixture(scope="module")
def two_runs():
    base = run(RunConfig(preset="tiny", steps=8, warmup_steps=2, label="baseline", threads=1))
    other = run(RunConfig(preset="tiny", steps=8, warmup_steps=2, label="sdpa", toggles={"sdpa": True},
                          threads=1))
    return base, other


def test_table_has_the_speedup_interval_its_verdict_and_a_reference_beside_its_row(two_runs):
    base, other = two_runs
    table = course.table([base, other], reference={"sdpa": "1.35× (build-nanogpt)"}, reference_name="public")
    frame = table.frame
    columns = ["speed-up (95%)", "verdict", "step_ms", "peak_mem_mb", "final_loss", "public"]
    assert list(frame.columns) in (columns, columns + ["note"])  # a note where a row has one (a busy machine)
    assert frame.loc["baseline", "speed-up (95%)"] == "baseline"
    interval = course.speedup_over(base, other)[0]
    assert frame.loc["sdpa", "speed-up (95%)"] == f"{interval.estimate:.2f}× ({interval.low:.2f}–{interval.high:.2f})"
    short, _ = course.unreliable_reason(interval, base.load, other.load, "sdpa", "baseline")
    # the interval's verdict, unless finding calls the row unreliable (a load that differed, an interval too wide)
    expected = interval.verdict if not short or short == "machine busy" else f"unreliable ({short})"
    assert frame.loc["sdpa", "verdict"] == expected
    assert frame.loc["sdpa", "public"] == "1.35× (build-nanogpt)" and frame.loc["baseline", "public"] == ""
    assert "…" not in repr(table) and "…" not in table._repr_html_()
    long = "x" * 80 + " (a public figure's source, read whole)"
    html = course.table([base, other], reference={"sdpa": long})._repr_html_()
    assert long in html and "..." not in html


def test_table_rounds_to_three_significant_figures(two_runs):
    frame = course.table(list(two_runs), columns=["step_ms", "tokens_per_s"]).frame
    for value in frame["tokens_per_s"]:
        digits = str(int(value)) if value >= 100 else str(value).replace(".", "").lstrip("0")
        assert len(digits.rstrip("0") or "0") <= 3, value


@pytest.mark.parametrize("value, rounded", [(1234.5678, 1230), (0.012345, 0.0123), (3.14159, 3.14), (0, 0),
                                            (None, None), (float("nan"), None), ("text", "text")])
def test_round(value, rounded):
    assert course._round(value) == rounded


def test_table_refuses_an_unknown_column_and_more_than_eight(two_runs):
    with pytest.raises(ValueError, match=r"names \['nope'\]; the columns are: run, status"):
        course.table(list(two_runs), columns=["nope"])
    with pytest.raises(ValueError, match=r"(9|10) columns; a reader takes in 8 at most"):
        course.table(list(two_runs), columns=["step_ms", "tokens_per_s", "mfu", "final_loss", "compile_s",
                                              "threads"])


def test_finding_says_what_the_table_says(two_runs):
    base, other = two_runs
    interval = course.speedup_over(base, other)[0]
    text = course.finding(other, base)
    short, detail = course.unreliable_reason(interval, base.load, other.load, "sdpa", "baseline")
    if interval.verdict == BUSY_VERDICT:  # the machine was busy during one of the two runs
        assert text.startswith(f"sdpa against baseline: {BUSY_VERDICT}")
    elif short:  # busier during one run than the other, or an interval too wide to tell the size
        assert text.startswith(f"sdpa against baseline: unreliable ({short})") and detail in text
    else:
        assert text.startswith(f"sdpa is {interval.verdict}")
    assert f"{interval.estimate:.2f}×" in text
    said = course.table([base, other]).frame.loc["sdpa", "verdict"]  # the table's verdict is the sentence's
    assert said.startswith("unreliable") == ("unreliable" in text.split(":")[1])
    assert course.finding_verdict(other, base) == ("unreliable" if short else interval.verdict)


def test_what_you_measured_is_a_short_list():
    summary = course.what_you_measured("compile: 1.2× faster", "bf16: within noise")
    assert summary._repr_markdown_() == "**What you measured**\n\n- compile: 1.2× faster\n- bf16: within noise"
    assert "<li>bf16: within noise</li>" in summary._repr_html_()
    with pytest.raises(ValueError, match="at least one line"):
        course.what_you_measured()


def test_show_code_is_monospace_in_static_html():
    block = course.show_code("sdpa")
    assert "font-family: monospace" in block._repr_html_()
    assert block._repr_markdown_().count("```") == 2


def test_setup_page_quiets_library_notices_but_not_scalekit(monkeypatch):
    monkeypatch.setattr(warnings, "filters", list(warnings.filters))  # restored after the test
    course.setup_page()
    with warnings.catch_warnings(record=True) as seen:
        warnings.warn("a library's deprecation notice", FutureWarning, stacklevel=1)
        warnings.warn("scalekit: the machine was busy", UserWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == ["scalekit: the machine was busy"]


def test_quiet_output_swallows_prints(capsys):
    with course.quiet_output():
        print("profiler banner")
    print("table")
    assert capsys.readouterr().out == "table\n"
