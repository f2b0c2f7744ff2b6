"""The generation Lab's live plots: per-token latency and tokens/s against the token index, a trace per run.

As in the training Lab (plots.py): the run's thread appends numbers under a lock (`add`), the view thread
pushes what arrived into the figures a few times a second at most (`flush`), figures built once.
"""

from __future__ import annotations

import threading

import numpy as np
import plotly.graph_objects as go

from ..inference.results import TokenRecord


def _figure(title: str, y_title: str, css_class: str) -> go.FigureWidget:
    fig = go.FigureWidget(layout=dict(
        title=dict(text=title, font=dict(size=14)), width=460, height=280, margin=dict(l=60, r=10, t=40, b=40),
        xaxis=dict(title="new token"), yaxis=dict(title=y_title), legend=dict(font=dict(size=10)),
        template="plotly_white"))
    fig.add_class(css_class)
    return fig


class GenerationPlots:
    def __init__(self):
        self.latency = _figure("Per-token latency (ms)", "ms", "scalekit-latency")
        self.rate = _figure("Tokens/s (batch × 1000 / ms)", "tokens/s", "scalekit-token-rate")
        self.figures = {"latency": self.latency, "rate": self.rate}
        self._lock = threading.Lock()
        self._series: dict[str, dict[str, tuple[list, list]]] = {}  # run -> figure key -> (x, y)
        self._trace: dict[tuple[str, str], int] = {}
        self._dirty: set[tuple[str, str]] = set()

    def add(self, run: str, record: TokenRecord) -> None:
        """One new token of `run` (index 0 is the first token, after the prefill: not a decode step)."""
        if record.index == 0 or not record.ms:
            return
        points = (("latency", record.ms), ("rate", len(record.token_ids) * 1e3 / record.ms))
        with self._lock:
            series = self._series.setdefault(run, {})
            for key, y in points:
                xs, ys = series.setdefault(key, ([], []))
                xs.append(record.index)
                ys.append(y)
                self._dirty.add((run, key))

    def flush(self) -> bool:
        """Push what arrived since the last flush into the figures; True when anything changed."""
        with self._lock:
            dirty, self._dirty = self._dirty, set()
            data = {(run, key): (np.asarray(self._series[run][key][0], dtype=np.int64),
                                 np.asarray(self._series[run][key][1], dtype=np.float64)) for run, key in dirty}
        for fig_key, fig in self.figures.items():
            indexes, xs, ys = [], [], []
            for (run, key), (x, y) in data.items():
                if key != fig_key:
                    continue
                if (run, key) not in self._trace:
                    fig.add_scatter(x=x, y=y, name=run, mode="lines", line=dict(width=1))
                    self._trace[(run, key)] = len(fig.data) - 1
                else:
                    indexes.append(self._trace[(run, key)])
                    xs.append(x)
                    ys.append(y)
            if indexes:
                fig.plotly_restyle({"x": xs, "y": ys}, trace_indexes=indexes)
        return bool(data)

    def trace_names(self, fig_key: str = "latency") -> list[str]:
        return [t.name for t in self.figures[fig_key].data]

    def widget(self):
        import ipywidgets as w

        return w.HBox([self.latency, self.rate])
