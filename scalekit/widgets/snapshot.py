"""A Lab's static snapshot: its results table and a picture of its plots, as plain HTML that needs no widget state.

A live Lab is widgets: a notebook saved without their state (JupyterLab's default, and binder/overrides.json's
setting) shows nothing of them, and a notebook saved with it carries every point of every live plot (tens of MB).
So a Lab in a notebook keeps a second, ordinary output below its panel: a snapshot, redrawn when a run finishes
(and by `lab.snapshot()`), which is saved with the notebook and shows in a static HTML export.

The plots are plotly figures written as HTML (a `<div>` and the `Plotly.newPlot` call that draws it), copied from
the live figures with long series thinned to MAX_POINTS a trace.  plotly.js itself is on the page once: where
plotly's notebook renderer is the default (as `scalekit.course.chapter.setup_page()` makes it), that renderer has put it
there, and the snapshot leans on it; elsewhere the snapshot carries plotly.js itself (about 4.6 MB, once: each
redraw replaces the last).
"""

from __future__ import annotations

import html
import math

import plotly.graph_objects as go
import plotly.io as pio

MAX_POINTS = 400  # points a trace keeps in the snapshot: a picture of the curve, not every step of a long run


def plotlyjs_on_page() -> bool:
    """True when plotly's notebook renderer is the default, after making sure it has put plotly.js on the page.

    Call it from the notebook's own thread (where a figure's output goes), before the snapshot is displayed: the
    snapshot's figures are drawn by plotly.js loaded above them on the page."""
    if "notebook" not in pio.renderers.default.split("+"):
        return False
    # plotly's own once-per-process step that displays plotly.js (what a first fig.show() would do)
    pio.renderers._activate_pending_renderers()
    return True


def thinned(fig: go.Figure, max_points: int = MAX_POINTS) -> go.Figure:
    """A static copy of `fig` in which a line with more than `max_points` points keeps every k-th one (and its last)."""
    out = go.Figure(fig)
    for trace in out.data:
        if trace.type != "scatter" or trace.x is None or len(trace.x) <= max_points:
            continue
        step = math.ceil(len(trace.x) / max_points)
        keep = list(range(0, len(trace.x), step))
        if keep[-1] != len(trace.x) - 1:
            keep.append(len(trace.x) - 1)
        trace.x = [trace.x[i] for i in keep]
        trace.y = [trace.y[i] for i in keep]
    return out


def figure_html(fig: go.Figure, include_plotlyjs: bool) -> str:
    """One figure as an HTML fragment that draws itself where plotly.js is (or, with `include_plotlyjs`, brings it)."""
    return pio.to_html(thinned(fig), full_html=False, include_plotlyjs=include_plotlyjs,
                       config={"displayModeBar": False, "responsive": False})


class Snapshot:
    """What a Lab measured, as a static output: the results table, then its plots.  `.table_html` is the table,
    `.figures` the static figures, `.runs` the number of runs in the table; `_repr_html_` is what is saved."""

    def __init__(self, title: str, table_html: str, figures: list[go.Figure], runs: int, plotlyjs_on_page: bool):
        # a class of its own: the live table (class scalekit-results) stays the one table a page query finds
        self.title, self.runs = title, runs
        self.table_html = table_html.replace("class='scalekit-results'", "class='scalekit-snapshot-results'", 1)
        self.figures = [thinned(f) for f in figures]
        self._plotlyjs_on_page = plotlyjs_on_page

    def _repr_html_(self) -> str:
        if not self.runs:
            return ""  # nothing measured yet: the output stays empty
        parts = [f"<p style='color:#4b5563;font-size:0.9em;margin:4px 0'>{html.escape(self.title)}</p>",
                 self.table_html]
        for i, fig in enumerate(self.figures):  # side by side where the page is wide enough, as in the Lab
            drawn = figure_html(fig, include_plotlyjs=not self._plotlyjs_on_page and i == 0)
            parts.append(f"<div style='display:inline-block;vertical-align:top'>{drawn}</div>")
        return f"<div class='scalekit-snapshot'>{''.join(parts)}</div>"

    def __repr__(self) -> str:
        return f"{self.title} ({len(self.figures)} plots)" if self.runs else ""
