"""The Lab's live plots: throughput, memory and loss per step, one named trace per run.

The run's thread only appends numbers to lists under a lock (`add`); the view thread pushes whatever
arrived since the last push into the figures, one restyle message per figure (`flush`), a few times a
second at most.  Figures are built once; traces are added the first time a run has a point.
"""

from __future__ import annotations

import threading

import numpy as np
import plotly.graph_objects as go

from ..measure.results import StepRecord

MB = 2**20


def _figure(title: str, y_title: str, css_class: str, width: int) -> go.FigureWidget:
    fig = go.FigureWidget(layout=dict(
        title=dict(text=title, font=dict(size=14)), width=width, height=280, margin=dict(l=60, r=10, t=40, b=40),
        xaxis=dict(title="step"), yaxis=dict(title=y_title), legend=dict(font=dict(size=10)),
        template="plotly_white"))
    fig.add_class(css_class)
    return fig


class LivePlots:
    def __init__(self, device_type: str = "cpu"):
        memory_title = "allocated (MB)" if device_type == "cuda" else "process RSS (MB)"
        self.throughput = _figure("Throughput (tokens/s)", "tokens/s", "scalekit-throughput", 920)
        self.memory = _figure("Memory (MB)", memory_title, "scalekit-memory", 460)
        self.loss = _figure("Loss", "loss", "scalekit-loss", 460)
        self.figures = {"throughput": self.throughput, "memory": self.memory, "loss": self.loss}
        self._lock = threading.Lock()
        # run key -> figure key -> ([x], [y]); what is drawn, and which (run, figure) changed since the last flush
        self._series: dict[str, dict[str, tuple[list, list]]] = {}
        self._trace: dict[tuple[str, str], int] = {}  # (run key, figure key) -> index in fig.data
        self._dirty: set[tuple[str, str]] = set()
        self.updates = 0  # flushes that changed a figure

    def add(self, run: str, record: StepRecord) -> None:
        """Record one step of `run` (cheap: called from the run's thread between steps)."""
        points = [("throughput", record.tokens_per_s)]
        if record.mem_bytes is not None:
            points.append(("memory", record.mem_bytes / MB))
        if record.loss is not None:
            points.append(("loss", record.loss))
        with self._lock:
            series = self._series.setdefault(run, {})
            for key, y in points:
                xs, ys = series.setdefault(key, ([], []))
                xs.append(record.step)
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
            indexes, xs, ys = [], [], []
            for (run, key), (x, y) in data.items():
                if key != fig_key:
                    continue
                if (run, key) not in self._trace:  # a run's first points: a new, validated trace
                    fig.add_scatter(x=x, y=y, name=run, mode="lines+markers", marker=dict(size=4))
                    self._trace[(run, key)] = len(fig.data) - 1
                else:
                    indexes.append(self._trace[(run, key)])
                    xs.append(x)
                    ys.append(y)
            if indexes:
                # one restyle message per figure; it skips plotly's per-assignment validation (≈6× cheaper),
                # safe here because the arrays are plain numeric columns built above
                fig.plotly_restyle({"x": xs, "y": ys}, trace_indexes=indexes)
        self.updates += 1
        return True

    def trace_names(self, fig_key: str = "throughput") -> list[str]:
        return [t.name for t in self.figures[fig_key].data]

    def widget(self):
        import ipywidgets as w

        return w.VBox([self.throughput, w.HBox([self.memory, self.loss])])
