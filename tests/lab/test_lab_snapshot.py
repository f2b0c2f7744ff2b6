"""The Lab's static snapshot: after a run, an ordinary output holds its results table and a picture of its plots,
which a notebook saved without widget state keeps and a static HTML export shows."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("ipywidgets", reason="the Lab needs ipywidgets (a scalekit dependency)")
pytest.importorskip("plotly", reason="the Lab needs plotly (a scalekit dependency)")

import plotly.io as pio  # noqa: E402

from scalekit import Lab, detect  # noqa: E402
from scalekit.widgets.snapshot import MAX_POINTS, Snapshot, thinned  # noqa: E402

FAST = dict(warmup_steps=1, log_every=2)


class Handle:
    """Stands in for IPython's DisplayHandle: records what the Lab draws in its snapshot output."""

    def __init__(self):
        self.shown = []

    def update(self, obj):
        self.shown.append(obj)


@pytest.fixture(scope="module")
def cpu():
    return detect("cpu")


def plain_module_lab(cpu, **kwargs) -> Lab:
    """A Lab on a plain nn.Module with its own batches and loss."""
    return Lab(model=torch.nn.Linear(8, 1), batch_fn=lambda b, device: (torch.randn(b, 8), torch.randn(b, 1)),
               loss_fn=lambda model, batch: F.mse_loss(model(batch[0]), batch[1]), device="cpu", hw=cpu, **kwargs)


def rows(html: str) -> list[str]:
    """The configuration cell of each body row of the snapshot's results table."""
    body = re.search(r"<tbody>(.*)</tbody>", html, re.S).group(1)
    return [re.findall(r"<td[^>]*>(.*?)</td>", row)[1] for row in re.findall(r"<tr>(.*?)</tr>", body, re.S)]


def test_each_finished_run_redraws_the_snapshot_with_its_row_and_plots(cpu):
    lab = plain_module_lab(cpu, steps=6, **FAST)
    lab._snapshot_handle = handle = Handle()  # as if the Lab had been displayed in a notebook
    lab.start()
    first = lab.wait(60)
    lab.set(grad_accum=2)
    lab.start()
    second = lab.wait(60)
    assert (first.status, second.status) == ("ok", "ok")
    assert len(handle.shown) == 2  # one redraw per finished run
    snap = handle.shown[-1]
    assert isinstance(snap, Snapshot) and snap.runs == 2
    html = snap._repr_html_()
    assert rows(html) == [first.label, second.label] == list(lab.results["run"])
    assert "scalekit-snapshot-results" in html and "'scalekit-results'" not in html  # not taken for the live table
    assert "2 runs" in snap.title
    # the plots, as static figures with the live ones' traces: throughput per step of each run
    titles = [f.layout.title.text for f in snap.figures]
    assert titles[:3] == ["Throughput (tokens/s)", "Memory (MB)", "Loss"]
    throughput = snap.figures[0]
    assert [t.name for t in throughput.data] == [f"#1 {first.label}", f"#2 {second.label}"]
    assert list(throughput.data[1].y) == [s.tokens_per_s for s in second.steps]
    # drawn by plotly.js from the HTML alone: one div and one newPlot call per figure, no widget model
    assert html.count('class="plotly-graph-div"') == html.count("Plotly.newPlot(") == len(snap.figures)
    assert "application/vnd.jupyter.widget" not in html and "model_id" not in html


def test_the_snapshot_brings_plotlyjs_once_unless_the_notebook_renderer_has(cpu, monkeypatch):
    lab = plain_module_lab(cpu, steps=6, **FAST)
    lab.start()
    lab.wait(60)
    monkeypatch.setattr(pio.renderers, "default", "plotly_mimetype")  # nothing has put plotly.js on the page
    alone = lab.snapshot()._repr_html_()
    bundled = alone.count("plotly.js v")  # plotly.js's banner, once per copy embedded
    assert bundled == 1
    monkeypatch.setattr(pio.renderers, "default", "plotly_mimetype+notebook")  # setup_page(): plotly.js is there
    beside = lab.snapshot()._repr_html_()
    assert "plotly.js v" not in beside and beside.count("Plotly.newPlot(") == alone.count("Plotly.newPlot(")
    assert len(beside) < 200_000  # small: the table and the points, not the library


def test_a_hugging_face_model_in_the_lab_gets_its_snapshot(cpu):
    pytest.importorskip("transformers", reason="the Hugging Face bridge needs transformers (scalekit[hf])")
    from scalekit.hf import causal_lm

    lab = Lab(model=causal_lm("gpt2", "tiny"), steps=2, batch_size=2, seq_len=16, device="cpu", hw=cpu,
              measure_memory=False, **FAST)
    lab._snapshot_handle = handle = Handle()
    lab.start()
    result = lab.wait(120)
    assert result.status == "ok", result.error
    (snap,) = handle.shown
    assert rows(snap._repr_html_()) == [result.label]
    loss = next(f for f in snap.figures if f.layout.title.text == "Loss")
    assert list(zip(loss.data[0].x, loss.data[0].y, strict=True)) == result.losses


def test_no_run_no_snapshot_and_a_failed_run_is_not_a_row(cpu):
    lab = plain_module_lab(cpu, steps=2, **FAST)
    assert lab.snapshot()._repr_html_() == ""  # nothing measured: the output stays empty
    lab._snapshot_handle = handle = Handle()
    lab.base_config = dataclasses.replace(lab.base_config, loss_fn=lambda model, batch: 1 / 0)
    lab.start()
    assert lab.wait(60).status == "failed"
    assert handle.shown and handle.shown[-1]._repr_html_() == ""  # failed runs have no row in the table


def test_long_runs_are_thinned_to_a_picture():
    import plotly.graph_objects as go

    fig = go.Figure(go.Scatter(x=list(range(10_000)), y=[float(i) for i in range(10_000)]))
    small = thinned(fig)
    assert MAX_POINTS / 2 <= len(small.data[0].x) <= MAX_POINTS + 1
    assert small.data[0].x[0] == 0 and small.data[0].x[-1] == 9_999  # both ends kept
    assert len(fig.data[0].x) == 10_000  # the live figure is untouched


def test_displaying_the_lab_shows_the_widget_then_a_snapshot_output(cpu, monkeypatch):
    import IPython.display

    shown = []

    def display(obj, display_id=None):
        shown.append((obj, display_id))
        return Handle() if display_id else None

    monkeypatch.setattr(IPython.display, "display", display)
    lab = plain_module_lab(cpu, steps=2, **FAST)
    lab._ipython_display_()
    assert shown[0] == (lab.widget, None)
    assert isinstance(shown[1][0], Snapshot) and shown[1][1] is True
    lab.start()
    lab.wait(60)
    assert lab._snapshot_handle.shown[-1].runs == 1  # the run redrew the output under the widget
