"""Live series for both Labs' plots: points from the run's thread, drawn by the view thread, a trace per run.

The run's thread only appends numbers to lists under a lock (`add`); the view thread pushes whatever
arrived since the last push into the figures, one restyle message per figure (`flush`), a few times a
second at most.  Figures are built once; traces are added the first time a run has a point.  A subclass
says only which figures it has and how one record becomes points (`points`).
"""

from __future__ import annotations

import threading

import numpy as np
import plotly.graph_objects as go


def figure(title: str, x_title: str, y_title: str, css_class: str, width: int) -> go.FigureWidget:
    """An empty live figure, styled alike in both Labs."""
    fig = go.FigureWidget(layout=dict(
        title=dict(text=title, font=dict(size=14)), width=width, height=280, margin=dict(l=60, r=10, t=40, b=40),
        xaxis=dict(title=x_title), yaxis=dict(title=y_title), legend=dict(font=dict(size=10)),
        template="plotly_white"))
    fig.add_class(css_class)
    return fig


class LiveSeries:
    """Named figures, one trace per run in each, fed from a worker thread and drawn from the view thread."""

    def __init__(self, figures: dict[str, go.FigureWidget], **trace_style):
        self.figures = figures
        self._trace_style = trace_style  # how a new trace is drawn (mode, marker, line)
        self._lock = threading.Lock()
        # run key -> figure key -> ([x], [y]); what is drawn, and which (run, figure) changed since the last flush
        self._series: dict[str, dict[str, tuple[list, list]]] = {}
        self._trace: dict[tuple[str, str], int] = {}  # (run key, figure key) -> index in fig.data
        self._dirty: set[tuple[str, str]] = set()
        self.updates = 0  # flushes that changed a figure

    def points(self, record) -> tuple[int, list[tuple[str, float]]]:
        """The x of `record` and its (figure key, y) points; no points to draw nothing."""
        raise NotImplementedError

    def add(self, run: str, record) -> None:
        """Record one record of `run` (cheap: called from the run's thread between steps)."""
        x, points = self.points(record)
        if not points:
            return
        with self._lock:
            series = self._series.setdefault(run, {})
            for key, y in points:
                xs, ys = series.setdefault(key, ([], []))
                xs.append(x)
                ys.append(y)
                self._dirty.add((run, key))

    def flush(self) -> bool:
        """Push what arrived since the last flush into the figures; True when anything changed."""
        with self._lock:
            dirty, self._dirty = self._dirty, set()
            # numpy arrays go out as binary buffers, in time that hardly grows with the run's length
            # (tuples of 5,000 floats cost ≈10 ms a redraw, arrays ≈0.5 ms)
            data = {(run, key): (np.asarray(self._series[run][key][0], dtype=np.int64),
                                 np.asarray(self._series[run][key][1], dtype=np.float64)) for run, key in dirty}
        if not data:
            return False
        for fig_key, fig in self.figures.items():
            self._draw(fig_key, fig, {run: xy for (run, key), xy in data.items() if key == fig_key})
        self.updates += 1
        return True

    def _draw(self, fig_key: str, fig: go.FigureWidget, data: dict[str, tuple]) -> None:
        indexes, xs, ys = [], [], []
        for run, (x, y) in data.items():
            if (run, fig_key) not in self._trace:  # a run's first points: a new, validated trace
                fig.add_scatter(x=x, y=y, name=run, **self._trace_style)
                self._trace[(run, fig_key)] = len(fig.data) - 1
            else:
                indexes.append(self._trace[(run, fig_key)])
                xs.append(x)
                ys.append(y)
        if indexes:
            # one restyle message per figure; it skips plotly's per-assignment validation (≈6× cheaper),
            # safe here because the arrays are plain numeric columns built above
            fig.plotly_restyle({"x": xs, "y": ys}, trace_indexes=indexes)

    def trace_names(self, fig_key: str | None = None) -> list[str]:
        """The run names drawn in one figure (the first one unless named)."""
        return [t.name for t in self.figures[fig_key or next(iter(self.figures))].data]
