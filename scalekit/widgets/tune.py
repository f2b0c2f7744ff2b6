"""The Lab's "Find the fastest": autotune in the background, each candidate drawn as it is measured.

A scatter of tokens/s against peak memory: kept candidates in green, rejected ones in grey (their reason in
the hover text), the frontier of the fastest configuration at each memory, and the current best as a star.
Stop (the Lab's) ends the search within one step; when it is done the panel is switched to the winner, so
Run measures it in full.
"""

from __future__ import annotations

import html
import threading

import ipywidgets as w
import plotly.graph_objects as go

from ..autotune import autotune
from ..errors import NothingFits, plain_error

MB = 2**20


def frontier(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The (memory, tokens/s) points no other point beats on both: faster or equal with less or equal memory."""
    best, out = -1.0, []
    for mem, tps in sorted(points):
        if tps > best:
            out.append((mem, tps))
            best = tps
    return out


class TuneControls:
    """The budget fields, the button, the live scatter and the outcome line, for one Lab."""

    def __init__(self, lab):
        self.lab = lab
        self.budget_mb = w.BoundedFloatText(value=0, min=0, max=10**7, description="budget MiB",
                                            tooltip="peak-memory budget (0: none)", layout=w.Layout(width="200px"))
        self.time_budget_s = w.BoundedIntText(value=120, min=5, max=10**6, description="search s",
                                              layout=w.Layout(width="170px"))
        self.button = w.Button(description="Find the fastest", icon="search", button_style="info")
        self.button.add_class("scalekit-tune")
        self.outcome = w.HTML("")
        self.figure = go.FigureWidget(layout=dict(
            title=dict(text="Autotune: each candidate, tokens/s against peak memory", font=dict(size=14)),
            xaxis=dict(title="peak memory (MiB)"), yaxis=dict(title="tokens/s"), height=320,
            template="plotly_white", margin=dict(l=60, r=10, t=40, b=40)))
        for name, mode, marker in (("kept", "markers", dict(color="#16a34a", size=9)),
                                   ("not kept", "markers", dict(color="#9ca3af", size=7)),
                                   ("frontier", "lines", None), ("best", "markers", dict(symbol="star", size=16,
                                                                                          color="#dc2626"))):
            self.figure.add_scatter(x=[], y=[], name=name, mode=mode, marker=marker, text=[], hoverinfo="text+x+y")
        self.figure.add_class("scalekit-tune-plot")
        self.result = None  # the last TuneResult
        self._thread: threading.Thread | None = None
        self.button.on_click(lab._guard(lambda _: self.start()))
        self.widget = w.VBox([w.HBox([self.button, self.budget_mb, self.time_budget_s]), self.outcome, self.figure])

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, budget_mb: float | None = None, time_budget_s: float | None = None, run_steps: int = 1000) -> bool:
        """Search from the baseline, the panel's current selection its first candidate (one it may switch off);
        False if a run or a search is already going."""
        lab = self.lab
        if lab.running or self.running:
            return False
        cfg = lab.config()
        budget = budget_mb if budget_mb is not None else (self.budget_mb.value or None)
        seconds = time_budget_s if time_budget_s is not None else self.time_budget_s.value
        lab._stop.clear()
        lab._lock_controls(True)
        self.button.disabled = True
        self.outcome.value = "searching…"
        self._thread = threading.Thread(target=self._work, args=(cfg, budget, seconds, run_steps),
                                        name="scalekit-lab-autotune", daemon=True)
        self._thread.start()
        return True

    def wait(self, timeout: float | None = None):
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise TimeoutError(f"autotune did not finish within {timeout} s")
        return self.result

    def _work(self, cfg, budget_mb, seconds, run_steps) -> None:
        lab = self.lab
        try:
            self.result = autotune(cfg, budget_bytes=int(budget_mb * MB) if budget_mb else None,
                                   time_budget_s=seconds, run_steps=run_steps, steps=cfg.steps,
                                   warmup_steps=cfg.warmup_steps, stop=lab._stop, hw=lab.hw,
                                   on_candidate=self._draw)
            lab.select(self.result.best.toggles)
            lab.batch_size.value = self.result.best.batch_size
            self.outcome.value = html.escape(self.result.summary())
        except NothingFits as exc:
            self.outcome.value = f"<span style='color:#b91c1c'>{html.escape(str(exc))}</span>"
        except BaseException as exc:  # the Lab stays usable whatever the search raised
            self.outcome.value = f"<span style='color:#b91c1c'>autotune failed: {html.escape(plain_error(exc))}</span>"
        finally:
            self.button.disabled = False
            lab._lock_controls(False)

    def _draw(self, candidate, search) -> None:
        measured = [c for c in search.candidates if c.tokens_per_s is not None and c.peak_bytes is not None]
        kept = [c for c in measured if c.accepted]
        rest = [c for c in measured if not c.accepted]
        line = frontier([(c.peak_bytes / MB, c.tokens_per_s) for c in measured])
        with self.figure.batch_update():
            for trace, group in zip(self.figure.data[:2], (kept, rest), strict=True):
                trace.x = [c.peak_bytes / MB for c in group]
                trace.y = [c.tokens_per_s for c in group]
                trace.text = [f"{c.label}: {c.reason}" for c in group]
            self.figure.data[2].x, self.figure.data[2].y = [m for m, _ in line], [t for _, t in line]
            if search.best_peak_bytes is not None and search.best_tokens_per_s is not None:
                self.figure.data[3].x, self.figure.data[3].y = [search.best_peak_bytes / MB], [search.best_tokens_per_s]
        self.outcome.value = html.escape(f"{len(search.candidates)} candidates; last: {candidate.label} — "
                                         f"{candidate.reason}")
