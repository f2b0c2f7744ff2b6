"""The Lab: switch optimizations on a live model in JupyterLab and watch throughput and memory move.

    from scalekit import Lab
    lab = Lab()            # or Lab(preset="small"), or Lab(model=..., batch_fn=..., loss_fn=...)
    lab                    # shows the panel; lab.results is the table as a DataFrame

Each press of Run builds the model fresh with the chosen toggles and calls `scalekit.run` in a
background thread, so the buttons stay live; Stop ends the run within one step and keeps what it
measured.  A second thread, the view, redraws the plots, the progress line and the elapsed time at
most `updates_per_s` times a second, and less often when a redraw is costly, so that the live view
takes about VIEW_BUDGET (0.5%) of the run's time at most.

Toggles that need several processes (ddp, fsdp) run in ranks the Lab launches; such a run is stopped
after `lab.launch_timeout_s` seconds (LAUNCH_TIMEOUT_S, 10 minutes, unless you change it), so a rank
that hangs ends as a failed run that names the ranks still running and where they were, and the Lab
is ready again, instead of waiting for ever.
"""

from __future__ import annotations

import dataclasses
import html
import json
import threading
import time
import traceback
from dataclasses import dataclass

import ipywidgets as w
import plotly.graph_objects as go

from ..config import RunConfig
from ..engine import plain_error, run
from ..errors import ConfigError
from ..files import check_writable, write_atomic
from ..hardware import detect
from ..measure.results import RunResult, StepRecord
from ..families import model_adapter
from ..plots import memory_breakdown_figure, step_time_figure, step_time_rows
from ..toggles import ORDER, TOGGLES, needs_process_group
from .panel import TogglePanel
from .plots import LivePlots
from .table import results_frame, results_html
from .tune import TuneControls

VIEW_BUDGET = 0.005  # the share of a run's time the view may take: it waits longer after a costly redraw
MAX_WAIT_S = 2.0  # but never leaves the plots this long without a redraw
LAUNCH_TIMEOUT_S = 600.0  # a launched (ddp, fsdp) run is stopped after this long: a hung rank cannot hold the Lab


def training_toggles(cfg: RunConfig) -> tuple:
    """The toggles a training Lab offers: those of the training loop, and, when the run evaluates
    (eval_every), the generation toggles that act on its evaluation (none that replaces weights)."""
    return tuple(t for t in ORDER if "train" in t.loops or (cfg.eval_every and not t.changes_weights))


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


TASKS = ("train", "generate")


class Lab:
    """A toggle panel, Run/Stop, live plots and a results table for one model.

    Lab(task="generate") is the generation Lab (widgets/generate_lab.py): inference toggles, a prompt,
    live per-token latency and tokens/s, the text as it is produced, quality beside speed."""

    def __new__(cls, *args, task: str = "train", **kwargs):
        if task not in TASKS:
            raise ConfigError(f"Lab.task must be one of {', '.join(map(repr, TASKS))}, got {task!r}")
        if task == "generate":
            from .generate_lab import GenerateLab

            return GenerateLab(*args, **kwargs)
        return super().__new__(cls)

    def __init__(self, preset: str = "auto", *, model=None, batch_fn=None, loss_fn=None, steps: int = 20,
                 batch_size: int | None = None, device: str = "auto", updates_per_s: float = 4.0, hw=None,
                 task: str = "train", **config):
        # validated now, so a bad argument fails here with the field named, not at the first Run
        self.base_config = RunConfig(preset=preset, model=model, batch_fn=batch_fn, loss_fn=loss_fn, steps=steps,
                                     batch_size=batch_size, device=device, **config)
        if isinstance(updates_per_s, bool) or not isinstance(updates_per_s, (int, float)) or not 0 < updates_per_s <= 60:
            raise ConfigError(f"Lab.updates_per_s must be a number in (0, 60] (plot redraws per second), "
                              f"got {updates_per_s!r}")
        self.hw = hw or detect(device)
        self.update_interval_s = 1.0 / updates_per_s
        self.launch_timeout_s = LAUNCH_TIMEOUT_S  # seconds a run in launched ranks may take (see the module doc)
        self.default_batch_size = self.base_config.resolve(self.hw).batch_size
        self.runs: list[tuple[int, RunResult]] = []  # every run, failed ones included
        self.view_costs: dict[int, ViewCost] = {}
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._number = 0
        self._status_text = ""
        self._status_since = time.perf_counter()
        self._steps_seen = 0
        self._steps_total = 0
        self._make_controls(steps)
        self._make_views()
        self._connect()
        self.tune = TuneControls(self)  # "Find the fastest": autotune from the panel's selection
        self.widget = self._layout()

    def _make_controls(self, steps: int) -> None:
        """The toggle panel, Run/Stop, the run's sizes and the save buttons."""
        # toggles that need several processes (ddp, fsdp) run in ranks the Lab launches
        self.panel = TogglePanel(self.hw, custom_model=self.base_config.custom_model, launches=True,
                                 adapter=model_adapter(self.base_config.model),  # what a Hugging Face model can change
                                 toggles=training_toggles(self.base_config))
        self.controls = self.panel.controls
        self.panel.preselect(self.base_config.toggles)  # Lab(toggles=...) starts with those switched on
        self.steps = w.BoundedIntText(value=steps, min=1, max=10**7, description="steps",
                                      layout=w.Layout(width="160px"))
        self.batch_size = w.BoundedIntText(value=self.default_batch_size, min=1, max=10**7, description="batch",
                                           layout=w.Layout(width="160px"))
        self.processes = w.BoundedIntText(value=2, min=2, max=1024, description="processes",
                                          tooltip="ranks launched for toggles that need several (ddp, fsdp)",
                                          layout=w.Layout(width="180px"))
        self.run_button = w.Button(description="Run", button_style="success", icon="play")
        self.stop_button = w.Button(description="Stop", button_style="danger", icon="stop", disabled=True)
        self.csv_button = w.Button(description="Save CSV", icon="download")
        self.json_button = w.Button(description="Save JSON", icon="download")
        self.run_button.add_class("scalekit-run")
        self.stop_button.add_class("scalekit-stop")

    def _make_views(self) -> None:
        """Progress, messages, the live plots, the results table and the memory bars."""
        self.progress = w.IntProgress(value=0, min=0, max=1, layout=w.Layout(width="240px"))
        self.status = w.HTML("ready")
        self.message = w.HTML("")  # failures and notes, in plain words
        self.warning = w.HTML("")  # toggles switched on together that cannot run together
        self.warning.add_class("scalekit-warning")
        self.message.add_class("scalekit-message")
        self.log = w.Output()  # tracebacks from the widget's own callbacks, should any occur
        self.plots = LivePlots(self.hw.device_type)
        self.table = w.HTML(results_html(results_frame([])))
        self.table.add_class("scalekit-table")
        # measured memory at the peak of a step, split in parameters, gradients, optimizer state, activations
        self.memory_bar = go.FigureWidget(layout=dict(title=dict(text="Memory at the peak of a step (MiB)",
                                                                 font=dict(size=14)),
                                                      barmode="stack", height=320, template="plotly_white",
                                                      margin=dict(l=60, r=10, t=40, b=40)))
        self.memory_bar.add_class("scalekit-memory-breakdown")
        # each run's mean step split in the wait for its batch and the rest: a data-bound run stands out
        self.time_bar = go.FigureWidget(layout=dict(title=dict(text="Time per step: waiting for data, and the rest "
                                                               "(ms)", font=dict(size=14)),
                                                    barmode="stack", height=320, template="plotly_white",
                                                    margin=dict(l=60, r=10, t=40, b=40)))
        self.time_bar.add_class("scalekit-data-wait")

    def _connect(self) -> None:
        self.run_button.on_click(self._guard(lambda _: self.start()))
        self.stop_button.on_click(self._guard(lambda _: self.stop()))
        self.csv_button.on_click(self._guard(lambda _: self._saved(self.to_csv("scalekit-lab-results.csv"))))
        self.json_button.on_click(self._guard(lambda _: self._saved(self.to_json("scalekit-lab-results.json"))))
        for control in self.controls.values():
            control.widget.observe(self._guard(lambda _: self._show_conflicts()), names="value")

    def _layout(self) -> w.VBox:
        where = "your model" if self.base_config.custom_model else f"preset {self.base_config.resolve(self.hw).preset}"
        header = w.HTML(f"<b>scalekit Lab</b> — {html.escape(where)} on {html.escape(self.hw.device_name)}")
        launchable = any(TOGGLES[name].needs_process_group and name not in c.reasons
                         for c in self.controls.values() for name in c.names)
        buttons = w.HBox([self.run_button, self.stop_button, self.steps, self.batch_size]
                         + ([self.processes] if launchable else []))
        widget = w.VBox([header, self.panel.widget, self.warning, buttons, w.HBox([self.progress, self.status]),
                         self.message, self.plots.widget(), self.table, self.time_bar, self.memory_bar,
                         w.HBox([self.csv_button, self.json_button]), self.tune.widget, self.log])
        widget.add_class("scalekit-lab")
        return widget

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)

    # -- what a user (or a test) drives ------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def set(self, **values) -> None:
        """Set controls by name, e.g. lab.set(sdpa=True, precision="bf16", compile="default"); False is off."""
        for key, value in values.items():
            if key not in self.controls:
                raise KeyError(f"no control {key!r}; controls: {', '.join(self.controls)}")
            self.controls[key].set(value)

    def select(self, toggles) -> None:
        """Show exactly `toggles` switched on (names, or {name: value} as in RunConfig.toggles)."""
        chosen = RunConfig(toggles=toggles).toggles  # validated and normalised, with errors that name the field
        self.panel.clear()
        self.panel.preselect(chosen)

    def config(self) -> RunConfig:
        """The RunConfig the next Run would measure."""
        cfg = dataclasses.replace(self.base_config, toggles=self.panel.selected(), steps=self.steps.value,
                                  batch_size=self.batch_size.value, label=None)
        label = cfg.describe()
        if cfg.batch_size != self.default_batch_size:
            label += f" (batch {cfg.batch_size})"
        return dataclasses.replace(cfg, label=label)

    def start(self) -> bool:
        """What Run does: start a run of the current selection in the background; False if none started."""
        if self.running:
            return False
        try:
            cfg = self.config()
        except Exception as exc:  # a combination RunConfig refuses: say so, stay usable
            self._say(f"Cannot run this combination: {plain_error(exc)}", error=True)
            return False
        self._number += 1
        number = self._number
        self._stop.clear()
        self._steps_seen, self._steps_total = 0, cfg.warmup_steps + cfg.steps
        self.progress.max, self.progress.value = self._steps_total, 0
        self._set_status(f"#{number} {cfg.label}: starting")
        self._say("")
        self._lock_controls(True)
        self._thread = threading.Thread(target=self._work, args=(number, cfg), name=f"scalekit-lab-run-{number}",
                                        daemon=True)
        self._thread.start()
        return True

    def find_fastest(self, budget_mb: float | None = None, time_budget_s: float | None = None,
                     run_steps: int = 1000) -> bool:
        """What "Find the fastest" does: autotune from the current selection in the background (see
        Lab.tune.result); when it is done the panel shows the winner.  Stop ends the search within one step."""
        return self.tune.start(budget_mb, time_budget_s, run_steps)

    def stop(self) -> None:
        """What Stop does: the run ends before its next step; what it measured is kept, marked stopped."""
        self._stop.set()
        self.stop_button.disabled = True
        if self.running:
            self._set_status(self._status_text.split(" — ")[0] + " — stopping after this step")

    def wait(self, timeout: float | None = None) -> RunResult | None:
        """Block until the current run (if any) has finished and the view is up to date; its result."""
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise TimeoutError(f"the run did not finish within {timeout} s")
        return self.runs[-1][1] if self.runs else None

    @property
    def results(self):
        """The results table as a pandas DataFrame: one row per run that measured (ok, stopped or diverged)."""
        return results_frame([(n, r) for n, r in self.runs if r.status in ("ok", "stopped", "diverged")])

    def to_csv(self, path) -> str:
        """The table as CSV, written atomically."""
        frame = self.results
        write_atomic(check_writable(path, "Lab.to_csv path"), lambda f: frame.to_csv(f, index=False))
        return str(path)

    def to_json(self, path) -> str:
        """The table (`results`) and every run in full (per-step records included)."""
        doc = {"results": json.loads(self.results.to_json(orient="records")),
               "runs": [dict(number=n, **r.to_dict()) for n, r in self.runs]}
        write_atomic(check_writable(path, "Lab.to_json path"), lambda f: json.dump(doc, f, indent=2, default=str))
        return str(path)

    # -- the run's thread and the view's thread ----------------------------------------------------
    def _work(self, number: int, cfg: RunConfig) -> None:
        key = f"#{number} {cfg.label}"
        done = threading.Event()
        cost = self.view_costs[number] = ViewCost()
        view = threading.Thread(target=self._view, args=(done, cost), name=f"scalekit-lab-view-{number}",
                                daemon=True)
        view.start()

        def on_step(record: StepRecord) -> None:
            self.plots.add(key, record)
            self._steps_seen = record.step + 1

        def on_status(text: str) -> None:
            self._status_text, self._status_since = f"{key}: {text}", time.perf_counter()

        t0 = time.perf_counter()
        result = None
        try:
            if needs_process_group(cfg.toggles):
                result = self._launch(cfg, on_step, on_status)
            else:
                result = run(cfg, on_step=on_step, on_status=on_status, stop=self._stop, hw=self.hw,
                             catch_errors=True)
        except BaseException as exc:  # anything a run can raise, SystemExit from a loss_fn included
            result = RunResult(label=cfg.label, config=cfg.to_dict(), status="failed", error=plain_error(exc),
                               device=self.hw.device_name)
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

    def trainer_callback(self, label: str = "HF Trainer", **kwargs):
        """A transformers TrainerCallback (scalekit.hf.ScalekitCallback) that shows a Trainer run in this Lab: its
        steps reach the live plots at the Trainer's logging steps, its result the table, as a run of the Lab's
        own would.  `kwargs` go to ScalekitCallback (warmup_steps, peak_tflops, ...)."""
        from ..hf.callback import ScalekitCallback

        self._number += 1
        number, key = self._number, f"#{self._number} {label}"
        done, cost = threading.Event(), ViewCost()
        view = threading.Thread(target=self._view, args=(done, cost), name=f"scalekit-lab-view-{number}", daemon=True)
        self.view_costs[number] = cost
        t0 = time.perf_counter()

        def on_step(record: StepRecord) -> None:
            if not view.is_alive() and not done.is_set():
                self._set_status(f"{key}: running in the Trainer")
                view.start()
            self.plots.add(key, record)
            self._steps_seen = record.step + 1

        def on_result(result: RunResult) -> None:
            cost.run_wall_s = time.perf_counter() - t0
            done.set()
            if view.is_alive():
                view.join()
            self.plots.flush()
            self._finish(number, key, result)

        return ScalekitCallback(label=label, on_step=on_step, on_result=on_result, **kwargs)

    def _launch(self, cfg: RunConfig, on_step, on_status) -> RunResult:
        """Run `cfg` in `processes` ranks; its steps reach the plots when the ranks are done (they run in
        other processes, so nothing streams back live).  Stop cannot reach into the ranks; the launch's
        time limit (launch_timeout_s) ends them if they hang."""
        from ..launch import launch_run

        n = self.processes.value
        on_status(f"running in {n} processes (at most {self.launch_timeout_s:g} s); the plots fill in when they "
                  f"finish")
        result = launch_run(cfg, nprocs=n, catch_errors=True, timeout_s=self.launch_timeout_s)
        for record in result.steps:
            on_step(record)
        return result

    def _view(self, done: threading.Event, cost: ViewCost) -> None:
        shown = None
        wait_s = self.update_interval_s
        while True:
            finished = done.wait(wait_s)
            t0, cpu0 = time.perf_counter(), time.thread_time()
            try:
                changed = self.plots.flush()
                elapsed = time.perf_counter() - self._status_since
                text = self._status_text + (f" — {elapsed:.0f} s" if elapsed >= 2 and not finished else "")
                if text != shown:
                    self.status.value, shown = html.escape(text), text
                if self.progress.value != self._steps_seen:
                    self.progress.value = min(self._steps_seen, self.progress.max)
                    changed = True
                cost.updates += changed
            except Exception:
                self._log_exception()
            spent_s = time.thread_time() - cpu0
            cost.cpu_s += spent_s
            cost.wall_s += time.perf_counter() - t0
            wait_s = min(MAX_WAIT_S, max(self.update_interval_s, spent_s / VIEW_BUDGET))
            if finished:
                return

    def _finish(self, number: int, key: str, result: RunResult) -> None:
        self.runs.append((number, result))
        if result.status == "failed":
            self._say(f"Run {key} failed: {result.error}. The Lab is ready for the next run.", error=True)
        elif result.status == "diverged":
            self._say(f"Run {key} diverged: {result.error}. Kept in the table, marked diverged.", error=True)
        elif result.status == "stopped":
            measured = sum(not s.warmup for s in result.steps)
            self._say(f"Run {key} stopped after {len(result.steps)} steps ({measured} measured); kept in the table "
                      f"as stopped.")
        self.table.value = results_html(self.results)
        self._show_memory()
        self._show_step_time()
        self._set_status(f"{key}: {result.status}" + (f", {result.tokens_per_s:,.0f} tokens/s"
                                                      if result.tokens_per_s else ""))
        self._lock_controls(False)

    # -- small helpers -----------------------------------------------------------------------------
    def _show_memory(self) -> None:
        """Redraw the stacked memory bars: one per run that measured its breakdown."""
        rows = [(f"#{n} {r.label}", parts) for n, r in self.runs if (parts := r.memory_breakdown())]
        if not rows:
            return
        fig = memory_breakdown_figure(rows, title=self.memory_bar.layout.title.text)
        self.memory_bar.data = ()
        self.memory_bar.add_traces(list(fig.data))

    def _show_step_time(self) -> None:
        """Redraw the data-wait bars: one per run that measured steps."""
        rows = [(f"#{n} {label}", parts) for n, r in self.runs for label, parts in step_time_rows([r])]
        if not rows:
            return
        fig = step_time_figure(rows, title=self.time_bar.layout.title.text)
        self.time_bar.data = ()
        self.time_bar.add_traces(list(fig.data))

    def _lock_controls(self, locked: bool) -> None:
        self.panel.set_locked(locked)
        self.run_button.disabled = locked
        self.stop_button.disabled = not locked
        self.steps.disabled = self.batch_size.disabled = self.processes.disabled = locked

    def _show_conflicts(self) -> None:
        text = "; ".join(self.panel.conflicts())
        self.warning.value = f"<span style='color:#b45309'>⚠ {html.escape(text)}</span>" if text else ""

    def _set_status(self, text: str) -> None:
        self._status_text, self._status_since = text, time.perf_counter()
        self.status.value = html.escape(text)

    def _say(self, text: str, error: bool = False) -> None:
        colour = "#b91c1c" if error else "#374151"
        self.message.value = f"<span style='color:{colour}'>{html.escape(text)}</span>" if text else ""

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
