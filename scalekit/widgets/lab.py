"""The Lab: switch optimizations on a live model in JupyterLab and watch throughput and memory move.

    from scalekit import Lab
    lab = Lab()            # or Lab(preset="small"), or Lab(model=..., batch_fn=..., loss_fn=...)
    lab                    # shows the panel; lab.results is the table as a DataFrame

Each press of Run builds the model fresh with the chosen toggles and calls `scalekit.run` in a
background thread, so the buttons stay live; Stop ends the run within one step and keeps what it
measured.  A second thread, the view, redraws the plots, the progress line and the elapsed time at
most `updates_per_s` times a second, and less often when a redraw is costly, so that the live view
takes about VIEW_BUDGET (0.5%) of the run's time at most.  Those threads, Run/Stop, the status line,
the error capture and Save CSV / Save JSON are the base both Labs share (runner.py); this file holds
what is the training Lab's own: its controls, its config, its steps, its bars of time and memory.

Toggles that need several processes (ddp, fsdp) run in ranks the Lab launches; such a run is stopped
after `lab.launch_timeout_s` seconds (LAUNCH_TIMEOUT_S, 10 minutes, unless you change it), so a rank
that hangs ends as a failed run that names the ranks still running and where they were, and the Lab
is ready again, instead of waiting for ever.
"""

from __future__ import annotations

import dataclasses
import html
import threading
import time

import ipywidgets as w
import plotly.graph_objects as go

from ..course.figures import memory_breakdown_figure, step_time_figure, step_time_rows
from ..errors import ConfigError
from ..hf.family_of import toggle_family
from ..toggles import ORDER, TOGGLES, needs_process_group
from ..training.config import RunConfig
from ..training.engine import run
from ..training.results import RunResult, StepRecord
from .panel import TogglePanel
from .plots import LivePlots
from .runner import Runner, ViewCost
from .table import results_frame, results_html
from .tune import TuneControls

LAUNCH_TIMEOUT_S = 600.0  # a launched (ddp, fsdp) run is stopped after this long: a hung rank cannot hold the Lab


def training_toggles(cfg: RunConfig) -> tuple:
    """The toggles a training Lab offers: those of the training loop, and, when the run evaluates
    (eval_every), the generation toggles that act on its evaluation (none that replaces weights)."""
    return tuple(t for t in ORDER if "train" in t.loops or (cfg.eval_every and not t.changes_weights))


TASKS = ("train", "generate")


class Lab(Runner):
    """A toggle panel, Run/Stop, live plots and a results table for one model.

    Lab(task="generate") is the generation Lab (widgets/generate_lab.py): inference toggles, a prompt,
    live per-token latency and tokens/s, the text as it is produced, quality beside speed."""

    result_type = RunResult
    shown_statuses = ("ok", "stopped", "diverged")
    export_name = "scalekit-lab-results"
    thread_name = "scalekit-lab"
    refused = "Cannot run this combination"
    _frame = staticmethod(results_frame)
    _html = staticmethod(results_html)

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
        super().__init__(hw, device, updates_per_s)  # Run/Stop, status, messages, the table, save buttons
        self.launch_timeout_s = LAUNCH_TIMEOUT_S  # seconds a run in launched ranks may take (see the module doc)
        self.default_batch_size = self.base_config.resolve(self.hw).batch_size
        self._steps_seen = 0
        self._steps_total = 0
        self._at_scale_views: list = []  # the views Lab.at_scale made: redrawn after each run
        self._make_controls(steps)
        self._make_views()
        self._connect()
        self.tune = TuneControls(self)  # "Find the fastest": autotune, the panel's selection a candidate
        self.widget = self._layout()

    def _make_controls(self, steps: int) -> None:
        """The toggle panel and the run's sizes."""
        # toggles that need several processes (ddp, fsdp) run in ranks the Lab launches
        self.panel = TogglePanel(self.hw, custom_model=self.base_config.custom_model, launches=True,
                                 adapter=toggle_family(self.base_config.model) if self.base_config.custom_model else None,
                                 toggles=training_toggles(self.base_config),
                                 # your model's data is fixed (batch_fn, dataset): what the data toggles act on
                                 config=self.base_config if self.base_config.custom_model else None)
        self.controls = self.panel.controls
        self.panel.preselect(self.base_config.toggles)  # Lab(toggles=...) starts with those switched on
        self.steps = w.BoundedIntText(value=steps, min=1, max=10**7, description="steps",
                                      layout=w.Layout(width="160px"))
        self.batch_size = w.BoundedIntText(value=self.default_batch_size, min=1, max=10**7, description="batch",
                                           layout=w.Layout(width="160px"))
        self.processes = w.BoundedIntText(value=2, min=2, max=1024, description="processes",
                                          tooltip="ranks launched for toggles that need several (ddp, fsdp)",
                                          layout=w.Layout(width="180px"))

    def _make_views(self) -> None:
        """The conflict warning, the live plots and the bars of time and memory per step."""
        self.warning = w.HTML("")  # toggles switched on together that cannot run together
        self.warning.add_class("scalekit-warning")
        self.plots = LivePlots(self.hw.device_type)
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

    # -- what a user (or a test) drives ------------------------------------------------------------
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

    def at_scale(self, gpus: str = "8xH100-SXM", toggles=None, batch_size: int | None = None,
                 seq_len: int | None = None):
        """The "at scale" view (widgets/at_scale.py) of this Lab's model: memory per GPU and a step's timeline as
        scalekit.predict predicts them on `gpus` with `toggles` (default: the panel's selection), beside the latest
        run's measured step time and peak memory and that run predicted on this machine ("this-cpu", once
        scalekit.calibrate() has measured it).  It is redrawn after each of the Lab's runs."""
        from .at_scale import AtScale, model_toggles

        cfg = self.config().resolve(self.hw)
        view = AtScale(model="llama3-8b", gpus=gpus, lab=self,
                       toggles=model_toggles(cfg.toggles) if toggles is None else toggles,
                       batch_size=batch_size or cfg.batch_size, seq_len=seq_len or cfg.seq_len)
        self._at_scale_views.append(view)
        return view

    def find_fastest(self, budget_mb: float | None = None, time_budget_s: float | None = None,
                     run_steps: int = 1000) -> bool:
        """What "Find the fastest" does: autotune in the background from the baseline, the current selection its
        first candidate (see Lab.tune.result); when it is done the panel shows the winner.  Stop ends the search
        within one step."""
        return self.tune.start(budget_mb, time_budget_s, run_steps)

    # -- the training parts of a run -------------------------------------------------------------------
    def _prepare(self, cfg: RunConfig) -> None:
        self._steps_seen, self._steps_total = 0, cfg.warmup_steps + cfg.steps
        self.progress.max, self.progress.value = self._steps_total, 0

    def _progress_now(self) -> int:
        return self._steps_seen

    def _measure(self, cfg: RunConfig, key: str) -> RunResult:
        """In the run's thread: `scalekit.run`, or launched ranks for toggles that need several processes."""
        def on_step(record: StepRecord) -> None:
            self.plots.add(key, record)
            self._steps_seen = record.step + 1

        def on_status(text: str) -> None:
            self._note_status(f"{key}: {text}")

        if needs_process_group(cfg.toggles):
            return self._launch(cfg, on_step, on_status)
        return run(cfg, on_step=on_step, on_status=on_status, stop=self._stop, hw=self.hw, catch_errors=True)

    def trainer_callback(self, label: str = "HF Trainer", **kwargs):
        """A transformers TrainerCallback (scalekit.hf.ScalekitCallback) that shows a Trainer run in this Lab: its
        steps reach the live plots at the Trainer's logging steps, its result the table, as a run of the Lab's
        own would.  `kwargs` go to ScalekitCallback (warmup_steps, peak_tflops, ...)."""
        from ..hf.callback import ScalekitCallback

        self._number += 1
        number, key = self._number, f"#{self._number} {label}"
        done, cost = threading.Event(), ViewCost()
        view = threading.Thread(target=self._view, args=(done, cost), name=f"{self.thread_name}-view-{number}",
                                daemon=True)
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

    def _say_outcome(self, key: str, result: RunResult) -> None:
        if result.status == "diverged":
            self._say(f"Run {key} diverged: {result.error}. Kept in the table, marked diverged.", error=True)
        elif result.status == "stopped":
            measured = sum(not s.warmup for s in result.steps)
            self._say(f"Run {key} stopped after {len(result.steps)} steps ({measured} measured); kept in the table "
                      f"as stopped.")

    @staticmethod
    def _rate(result: RunResult) -> str:
        return f", {result.tokens_per_s:,.0f} tokens/s" if result.tokens_per_s else ""

    def _show_result(self, result: RunResult) -> None:
        self._show_memory()
        self._show_step_time()
        for view in self._at_scale_views:  # the at-scale views: the latest run measured beside their prediction
            try:
                view.refresh()
            except Exception as exc:  # a view that cannot redraw says so; the run's own figures stand
                self._say(f"The at-scale view could not redraw: {type(exc).__name__}: {exc}", error=True)

    def _snapshot_figures(self) -> list:
        """The live plots, the bars of time and memory per step and autotune's scatter, where they have points."""
        own = (self.time_bar, self.memory_bar, self.tune.figure)
        return [*super()._snapshot_figures(),
                *(fig for fig in own if any(t.x is not None and len(t.x) for t in fig.data))]

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
        super()._lock_controls(locked)
        self.steps.disabled = self.batch_size.disabled = self.processes.disabled = locked

    def _show_conflicts(self) -> None:
        text = "; ".join(self.panel.conflicts())
        self.warning.value = f"<span style='color:#b45309'>⚠ {html.escape(text)}</span>" if text else ""
