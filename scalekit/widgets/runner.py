"""What both Labs share: a run in the background, Run and Stop, the status line, errors in words, export.

Run (`start`) takes the Lab's config, locks its controls and measures in a worker thread (`_measure`, the
Lab's own), so the buttons stay live; Stop sets an Event the loop reads before its next step or token.  A
view thread redraws the plots, the Lab's own live parts, the progress and the status line (with the
seconds elapsed on a slow step) at most `updates_per_s` times a second, and less often when a redraw is
costly, so that the live view takes about VIEW_BUDGET (0.5%) of the run's time at most.  Whatever a run
raises, it is kept as a failed run in plain words and the controls come back in a `finally`; an error in
the widgets' own callbacks goes to the message line and its traceback to the Output widget `log`.
"""

from __future__ import annotations

import html
import json
import threading
import time
import traceback
from dataclasses import dataclass

import ipywidgets as w

from ..errors import ConfigError, plain_error
from ..files import check_writable, write_atomic
from ..machine.hardware import detect
from .snapshot import Snapshot, plotlyjs_on_page

VIEW_BUDGET = 0.005  # the share of a run's time the view may take: it waits longer after a costly redraw
MAX_WAIT_S = 2.0  # but never leaves the plots this long without a redraw


@dataclass
class ViewCost:
    """What the live view of one run cost: redraws, and the view thread's time on them.

    cpu_s is the view thread's own CPU time (time.thread_time): what it can take from the run, which
    must hand it the GIL.  wall_s also counts the view's waits for the GIL, while the run goes on.
    """

    updates: int = 0
    cpu_s: float = 0.0
    wall_s: float = 0.0
    run_wall_s: float = 0.0

    @property
    def fraction(self) -> float:
        """The view's CPU time as a share of the run's wall time."""
        return self.cpu_s / self.run_wall_s if self.run_wall_s else 0.0


class Runner:
    """The base of both Labs.  A subclass builds `panel`, `controls`, `plots` and `widget`, and says its
    own parts: `config`, `_measure`, `_prepare`, `_progress_now`, `_say_outcome`, `_rate` (and, where it
    has them, `_redraw_own`, `_show_result`, more controls to lock in `_lock_controls`)."""

    result_type: type  # what a run that raised is kept as (RunResult, GenerateResult)
    shown_statuses: tuple[str, ...]  # runs with these statuses have a row in the table
    export_name: str  # Save CSV / Save JSON write <export_name>.csv / .json
    thread_name: str  # threads are <thread_name>-run-N and <thread_name>-view-N
    refused = "Cannot run this"  # the message's start when the config is refused
    _frame: staticmethod  # (number, result) pairs -> the results DataFrame
    _html: staticmethod  # that DataFrame -> the table's HTML

    def __init__(self, hw, device: str, updates_per_s: float):
        if isinstance(updates_per_s, bool) or not isinstance(updates_per_s, (int, float)) or not 0 < updates_per_s <= 60:
            raise ConfigError(f"Lab.updates_per_s must be a number in (0, 60] (plot redraws per second), "
                              f"got {updates_per_s!r}")
        self.hw = hw or detect(device)
        self.update_interval_s = 1.0 / updates_per_s
        self.runs: list[tuple[int, object]] = []  # (number, result) of every run, failed ones included
        self.view_costs: dict[int, ViewCost] = {}
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._number = 0
        self._status_text = "ready"
        self._status_since = time.perf_counter()
        self._snapshot_handle = None  # the notebook output the snapshot is drawn in, once the Lab is displayed
        self._plotlyjs_on_page = False
        self._make_run_widgets()

    def _make_run_widgets(self) -> None:
        """Run/Stop, the save buttons, progress, status, messages, the log and the table, wired."""
        self.run_button = w.Button(description="Run", button_style="success", icon="play")
        self.stop_button = w.Button(description="Stop", button_style="danger", icon="stop", disabled=True)
        self.csv_button = w.Button(description="Save CSV", icon="download")
        self.json_button = w.Button(description="Save JSON", icon="download")
        self.run_button.add_class("scalekit-run")
        self.stop_button.add_class("scalekit-stop")
        self.progress = w.IntProgress(value=0, min=0, max=1, layout=w.Layout(width="240px"))
        self.status = w.HTML("ready")
        self.message = w.HTML("")  # failures and notes, in plain words
        self.message.add_class("scalekit-message")
        self.log = w.Output()  # tracebacks from the widget's own callbacks, should any occur
        self.table = w.HTML(self._html(self.results))
        self.table.add_class("scalekit-table")
        self.run_button.on_click(self._guard(lambda _: self.start()))
        self.stop_button.on_click(self._guard(lambda _: self.stop()))
        self.csv_button.on_click(self._guard(lambda _: self._saved(self.to_csv(f"{self.export_name}.csv"))))
        self.json_button.on_click(self._guard(lambda _: self._saved(self.to_json(f"{self.export_name}.json"))))

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)

    def _ipython_display_(self) -> None:
        """In a notebook: the live widget, and below it an ordinary output that holds the static snapshot (empty
        until a run finishes), which is what a notebook saved without widget state keeps of the Lab."""
        from IPython.display import display

        display(self.widget)
        self._plotlyjs_on_page = plotlyjs_on_page()  # decided here, in the notebook's thread, above the snapshot
        self._snapshot_handle = display(self.snapshot(update=False), display_id=True)

    def snapshot(self, update: bool = True) -> Snapshot:
        """The results table and a picture of the plots as static HTML (widgets/snapshot.py): what a saved notebook
        or an HTML export shows of this Lab.  The Lab redraws it below its panel after every run; `update` also
        redraws it now."""
        if update and self._snapshot_handle is None:  # called from a notebook before the Lab was displayed
            self._plotlyjs_on_page = plotlyjs_on_page()
        snap = Snapshot(self._snapshot_title(), self.table.value, self._snapshot_figures(), len(self.results),
                        self._plotlyjs_on_page)
        if update and self._snapshot_handle is not None:
            self._snapshot_handle.update(snap)
        return snap

    def _snapshot_title(self) -> str:
        shown = len(self.results)
        return (f"Snapshot of the {shown} run{'s' * (shown != 1)} above (static: saved with the notebook and shown in "
                f"an HTML export, where the live panel is not)")

    def _snapshot_figures(self) -> list:
        """The figures the snapshot pictures: the live plots that have a trace (a Lab adds its own views)."""
        return [fig for fig in self.plots.figures.values() if fig.data]

    # -- what a user (or a test) drives ------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def set(self, **values) -> None:
        """Set controls by name, e.g. lab.set(sdpa=True, precision="bf16") or lab.set(kv_cache="static");
        False is off."""
        for key, value in values.items():
            if key not in self.controls:
                raise KeyError(f"no control {key!r}; controls: {', '.join(self.controls)}")
            self.controls[key].set(value)

    def start(self) -> bool:
        """What Run does: start a run of the current selection in the background; False if none started."""
        if self.running:
            return False
        try:
            cfg = self._checked_config()
        except Exception as exc:  # a selection the config refuses: say so, stay usable
            self._say(f"{self.refused}: {plain_error(exc)}", error=True)
            return False
        self._number += 1
        number = self._number
        self._stop.clear()
        self._prepare(cfg)
        self._set_status(f"#{number} {self._label(cfg)}: starting")
        self._say("")
        self._lock_controls(True)
        self._thread = threading.Thread(target=self._work, args=(number, cfg), name=f"{self.thread_name}-run-{number}",
                                        daemon=True)
        self._thread.start()
        return True

    def stop(self) -> None:
        """What Stop does: the run ends before its next step; what it measured is kept, marked stopped."""
        self._stop.set()
        self.stop_button.disabled = True
        if self.running:
            self._set_status(self._status_text.split(" — ")[0] + " — stopping after this step")

    def wait(self, timeout: float | None = None):
        """Block until the current run (if any) has finished and the view is up to date; its result."""
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise TimeoutError(f"the run did not finish within {timeout} s")
        return self.runs[-1][1] if self.runs else None

    @property
    def results(self):
        """The results table as a pandas DataFrame: one row per run that measured (see shown_statuses)."""
        return self._frame([(n, r) for n, r in self.runs if r.status in self.shown_statuses])

    def to_csv(self, path) -> str:
        """The table as CSV, written atomically."""
        frame = self.results
        write_atomic(check_writable(path, "Lab.to_csv path"), lambda f: frame.to_csv(f, index=False))
        return str(path)

    def to_json(self, path) -> str:
        """The table (`results`) and every run in full (per-step or per-token records included)."""
        doc = {"results": json.loads(self.results.to_json(orient="records")),
               "runs": [dict(number=n, **r.to_dict()) for n, r in self.runs]}
        write_atomic(check_writable(path, "Lab.to_json path"), lambda f: json.dump(doc, f, indent=2, default=str))
        return str(path)

    # -- the run's thread and the view's thread ----------------------------------------------------
    def _work(self, number: int, cfg) -> None:
        key = f"#{number} {self._label(cfg)}"
        done = threading.Event()
        cost = self.view_costs[number] = ViewCost()
        view = threading.Thread(target=self._view, args=(done, cost), name=f"{self.thread_name}-view-{number}",
                                daemon=True)
        view.start()
        t0 = time.perf_counter()
        result = None
        try:
            result = self._measure(cfg, key)
        except BaseException as exc:  # anything a run can raise, SystemExit from a user's code included
            result = self.result_type(label=self._label(cfg), config=cfg.to_dict(), status="failed",
                                      error=plain_error(exc), device=self.hw.device_name)
        finally:
            cost.run_wall_s = time.perf_counter() - t0
            done.set()
            view.join()
            try:
                self._finish(number, key, result)
            except BaseException:
                self._log_exception()
            finally:
                self._lock_controls(False)  # the Lab stays usable, whatever happened

    def _view(self, done: threading.Event, cost: ViewCost) -> None:
        wait_s = self.update_interval_s
        while True:
            finished = done.wait(wait_s)
            t0, cpu0 = time.perf_counter(), time.thread_time()
            try:
                cost.updates += self._redraw(finished)
            except Exception:
                self._log_exception()
            spent_s = time.thread_time() - cpu0
            cost.cpu_s += spent_s
            cost.wall_s += time.perf_counter() - t0
            wait_s = min(MAX_WAIT_S, max(self.update_interval_s, spent_s / VIEW_BUDGET))
            if finished:
                return

    def _redraw(self, finished: bool) -> bool:
        """One pass of the view; True when a plot or the progress changed."""
        changed = self.plots.flush()
        changed = self._redraw_own() or changed
        seen = min(self._progress_now(), self.progress.max)
        if self.progress.value != seen:
            self.progress.value = seen
            changed = True
        elapsed = time.perf_counter() - self._status_since
        # an unchanged text costs nothing: traitlets send no message for an equal value
        self.status.value = html.escape(self._status_text + (f" — {elapsed:.0f} s" if elapsed >= 2 and not finished
                                                             else ""))
        return changed

    def _finish(self, number: int, key: str, result) -> None:
        self.runs.append((number, result))
        if result.status == "failed":
            self._say(f"Run {key} failed: {result.error}. The Lab is ready for the next run.", error=True)
        else:
            self._say_outcome(key, result)
            if result.busy_note:  # beside the figures, not only in the table's note; after what the run said
                self._say(f"Run {key}: {result.busy_note}.", append=True)
        self.table.value = self._html(self.results)
        self._show_result(result)
        if self._snapshot_handle is not None:
            self.snapshot()
        self._set_status(f"{key}: {result.status}{self._rate(result)}")
        self._lock_controls(False)

    # -- what a Lab may add ------------------------------------------------------------------------
    def _checked_config(self):
        """The config the next Run measures; raises, in words, if it cannot run."""
        return self.config()

    @staticmethod
    def _label(cfg) -> str:
        return cfg.label or cfg.describe()

    def _redraw_own(self) -> bool:
        """The Lab's own live parts, beside the plots; True when something changed."""
        return False

    def _show_result(self, result) -> None:
        """The Lab's own views of a finished run, beside the table."""

    # -- small helpers -----------------------------------------------------------------------------
    def _lock_controls(self, locked: bool) -> None:
        self.panel.set_locked(locked)
        self.run_button.disabled = locked
        self.stop_button.disabled = not locked

    def _note_status(self, text: str) -> None:
        """From the run's thread: the view shows it at its next redraw."""
        self._status_text, self._status_since = text, time.perf_counter()

    def _set_status(self, text: str) -> None:
        self._note_status(text)
        self.status.value = html.escape(text)

    def _say(self, text: str, error: bool = False, append: bool = False) -> None:
        colour = "#b91c1c" if error else "#374151"
        said = f"<span style='color:{colour}'>{html.escape(text)}</span>" if text else ""
        self.message.value = f"{self.message.value} {said}".strip() if append else said

    def _saved(self, path: str) -> None:
        self._say(f"Saved {path}")

    def _guard(self, handler):
        """Run a button handler; an error in it goes to the message line and the log, not into the void."""
        def wrapped(button):
            try:
                handler(button)
            except Exception as exc:
                self._say(f"{plain_error(exc)}", error=True)
                self._log_exception()
        return wrapped

    def _log_exception(self) -> None:
        self.log.append_stderr(traceback.format_exc())
