"""The "at scale" view: pick GPUs, degrees and toggles; see memory per GPU and a step's timeline as
`scalekit.predict` predicts them, beside what the Lab measured on the ranks in hand.

    from scalekit.widgets import AtScale
    view = AtScale("llama3-8b", gpus="8xH100-SXM", toggles={"fsdp": True, "bf16": True})
    view                     # the controls, the bars of memory per GPU, the step's timeline, the assumptions
    lab.at_scale()           # the same for a Lab's model, with its latest result measured beside

Every change of a control calls `predict` again (`view.prediction` is its Prediction, `view.refusal` the sentence
when it refuses: degrees that do not divide the heads, layers, GPUs or batch; `strict` is not used, so a plan that
does not fit is drawn over the part's capacity and said in words).  With a Lab, the latest run's measured step time
and peak memory sit beside the prediction of that same run (its preset, toggles, batch and ranks) on the part
"this-cpu" when `scalekit.calibrate()` has measured it; otherwise the view says it is not calibrated (it never
calibrates by itself: that takes seconds and starts ranks).
"""

from __future__ import annotations

import html

import ipywidgets as w
import plotly.graph_objects as go

from ..errors import ConfigError
from ..predict import PARTS, PUBLIC, predict

GIB = 2**30
MIB = 2**20
MEMORY_PARTS = (("params", "parameters"), ("grads", "gradients"), ("optimizer_state", "optimizer state"),
                ("activations", "activations"), ("comm_buffers", "buffers"))
SHARDINGS = ("none", "ddp", "fsdp", "zero1", "zero2")  # how the data-parallel ranks hold the model
DTYPES = ("fp32", "tf32", "bf16", "fp16")  # what the matmuls compute in (a toggle each, fp32 none)
CHECKPOINTING = (("off", None), ("every block", 1), ("every 2nd block", 2), ("selective", "selective"))
SCHEDULES = ("1f1b", "gpipe")
LOCAL = "this-cpu"  # the part calibrate() measures: where the Lab's runs are predicted


def toggles_of(sharding: str = "none", tensor: int = 1, stages: int = 1, schedule: str = "1f1b",
               micro_batches: int = 4, dtype: str = "fp32", checkpointing=None, sdpa: bool = False) -> dict:
    """The toggles (as RunConfig and predict take them) for a choice of the view's controls."""
    toggles: dict = {}
    if sharding in ("ddp", "fsdp"):
        toggles[sharding] = True
    elif sharding in ("zero1", "zero2"):
        toggles["zero"] = sharding
    if tensor > 1:
        toggles["tensor_parallel"] = tensor
    if stages > 1:
        toggles["pipeline_parallel"] = f"{schedule}/{micro_batches},stages={stages}"
    if dtype != "fp32":
        toggles[dtype] = True
    if checkpointing is not None:
        toggles["checkpointing"] = checkpointing
    if sdpa:
        toggles["sdpa"] = True
    return toggles


def memory_rows(pred) -> dict[str, float]:
    """{part's label: GiB per GPU} of a Prediction, as the bars draw them."""
    return {label: pred.memory[key] / GIB for key, label in MEMORY_PARTS}


def timeline_rows(pred) -> dict[str, float]:
    """{segment: ms} of a Prediction's step, as the timeline draws them, in order: compute, each collective's exposed
    time, the bubble (a segment of 0 is kept: the legend says the term exists)."""
    rows = {"compute": pred.compute_s * 1e3}
    for c in pred.collectives:
        rows[f"{c.name} ({c.op})"] = c.exposed_s * 1e3
    rows["bubble"] = pred.bubble_s * 1e3
    return rows


class AtScale:
    """Controls for a prediction (part, GPU count, degrees, toggles, model, batch, sequence), its figures, and,
    with a Lab, the Lab's latest measurement beside the prediction of the same run on this machine."""

    def __init__(self, model="llama3-8b", gpus: str = "8xH100-SXM", toggles=None, batch_size: int = 8,
                 seq_len: int = 1024, lab=None):
        self.lab = lab
        self._refreshing = False  # a refresh that changes a control (the parts offered) does not start another
        self.prediction = None  # the Prediction shown, or None while a refusal is
        self.refusal = ""  # the sentence predict refused the controls' choice with ("" when it did not)
        self.local = None  # (measured result, its Prediction on this-cpu or None, what is said of them)
        count, part = _split_gpus(gpus)
        models = [m for m in ([_lab_model(lab)] if lab is not None else []) + [model] + sorted(PUBLIC)
                  if m is not None]
        self.model = w.Dropdown(options=list(dict.fromkeys(models)), value=model if lab is None else models[0],
                                description="model")
        self.part = w.Dropdown(options=sorted(PARTS), value=part, description="GPU")
        self.count = w.BoundedIntText(value=count, min=1, max=100_000, description="GPUs", layout=w.Layout(width="170px"))
        chosen = _controls_of(toggles or {}, count)
        self.sharding = w.Dropdown(options=SHARDINGS, value=chosen["sharding"], description="data/FSDP")
        self.tensor = w.BoundedIntText(value=chosen["tensor"], min=1, max=1024, description="tensor",
                                       layout=w.Layout(width="170px"))
        self.stages = w.BoundedIntText(value=chosen["stages"], min=1, max=1024, description="pipeline",
                                       layout=w.Layout(width="170px"))
        self.schedule = w.Dropdown(options=SCHEDULES, value=chosen["schedule"], description="schedule")
        self.micro_batches = w.BoundedIntText(value=chosen["micro_batches"], min=1, max=4096, description="micro",
                                              layout=w.Layout(width="170px"))
        self.dtype = w.Dropdown(options=DTYPES, value=chosen["dtype"], description="precision")
        self.checkpointing = w.Dropdown(options=CHECKPOINTING, value=chosen["checkpointing"],
                                        description="checkpointing")
        self.sdpa = w.Checkbox(value=chosen["sdpa"], description="sdpa (fused attention)")
        self.batch_size = w.BoundedIntText(value=batch_size, min=1, max=10**7, description="batch",
                                           layout=w.Layout(width="170px"))
        self.seq_len = w.BoundedIntText(value=seq_len, min=1, max=10**7, description="seq_len",
                                        layout=w.Layout(width="170px"))
        self.controls = (self.model, self.part, self.count, self.sharding, self.tensor, self.stages, self.schedule,
                         self.micro_batches, self.dtype, self.checkpointing, self.sdpa, self.batch_size, self.seq_len)
        self._make_views()
        for control in self.controls:
            control.observe(lambda _: self.refresh(), names="value")
        self.widget = w.VBox([
            w.HTML("<b>At scale</b> — predicted per GPU by scalekit.predict (nothing runs)"),
            w.HBox([self.model, self.part, self.count]),
            w.HBox([self.sharding, self.tensor, self.stages, self.schedule, self.micro_batches]),
            w.HBox([self.dtype, self.checkpointing, self.sdpa, self.batch_size, self.seq_len]),
            self.verdict, w.HBox([self.memory_figure]), self.timeline, self.measured, self.assumptions])
        self.widget.add_class("scalekit-at-scale")
        self.refresh()

    def _make_views(self) -> None:
        """The verdict line, the bars of memory per GPU, the step's timeline, the measured line, the assumptions."""
        self.verdict = w.HTML("")
        self.verdict.add_class("scalekit-at-scale-verdict")
        self.memory_figure = go.FigureWidget(layout=dict(
            title=dict(text="Memory per GPU (GiB)", font=dict(size=14)), barmode="stack", height=340,
            template="plotly_white", margin=dict(l=60, r=10, t=40, b=40)))
        self.memory_figure.add_class("scalekit-at-scale-memory")
        self.timeline = go.FigureWidget(layout=dict(
            title=dict(text="One step (ms): compute, exposed communication, bubble", font=dict(size=14)),
            barmode="stack", height=260, template="plotly_white", margin=dict(l=120, r=10, t=40, b=40)))
        self.timeline.add_class("scalekit-at-scale-timeline")
        self.assumptions = w.HTML("")
        self.measured = w.HTML("")
        self.measured.add_class("scalekit-at-scale-measured")

    # -- what a user (or a test) reads ------------------------------------------------------------------------
    def gpus(self) -> str:
        return f"{self.count.value}x{self.part.value}"

    def toggles(self) -> dict:
        return toggles_of(self.sharding.value, self.tensor.value, self.stages.value, self.schedule.value,
                          self.micro_batches.value, self.dtype.value, self.checkpointing.value, self.sdpa.value)

    def refresh(self) -> None:
        """Predict the controls' choice again and redraw; read the Lab's latest result again."""
        if self._refreshing:
            return
        self._refreshing = True
        try:
            self._refresh()
        finally:
            self._refreshing = False

    def _refresh(self) -> None:
        if set(self.part.options) != set(PARTS):  # a part registered since (this-cpu, by calibrate()): offered too
            chosen = self.part.value
            self.part.options = sorted(PARTS)
            self.part.value = chosen if chosen in PARTS else self.part.options[0]
        try:
            self.prediction = predict(self.model.value, self.gpus(), toggles=self.toggles(),
                                      batch_size=self.batch_size.value, seq_len=self.seq_len.value)
            self.refusal = ""
        except ConfigError as exc:
            self.prediction, self.refusal = None, str(exc)
        self.local = self._local()
        self._draw()

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)

    # -- drawing ----------------------------------------------------------------------------------------------
    def _draw(self) -> None:
        pred = self.prediction
        with self.memory_figure.batch_update(), self.timeline.batch_update():
            self.memory_figure.data, self.timeline.data = (), ()
            self.memory_figure.layout.shapes = ()
            self.measured.value = f"<div>{self.local[2]}</div>" if self.local is not None else ""
            if pred is None:
                self.verdict.value = f"<span style='color:#b91c1c'>✗ {html.escape(self.refusal)}</span>"
                self.assumptions.value = ""
                return
            bars = [("predicted", memory_rows(pred))]
            measured = self._measured_memory()
            if measured is not None:
                bars.append(measured)
            for _, label in MEMORY_PARTS:
                self.memory_figure.add_bar(name=label, x=[b[0] for b in bars], y=[b[1].get(label, 0.0) for b in bars])
            capacity = pred.capacity_bytes / GIB
            self.memory_figure.add_scatter(name=f"{self.part.value} capacity", x=["predicted"], y=[capacity],
                                           mode="markers", marker=dict(symbol="line-ew-open", size=40, color="#b91c1c"))
            for segment, ms in timeline_rows(pred).items():
                self.timeline.add_bar(name=segment, x=[ms], y=["predicted"], orientation="h")
            self._draw_local_steps()
            mfu = f"{pred.mfu:.1%}" if pred.mfu is not None else "n/a"
            color = "#15803d" if pred.fits else "#b91c1c"
            self.verdict.value = (f"<span style='color:{color}'>{'✓' if pred.fits else '✗'} "
                                  f"{html.escape(pred.verdict())}</span> — step {pred.step_s * 1e3:,.1f} ms, "
                                  f"{pred.tokens_per_s_per_gpu:,.0f} tokens/s per GPU, MFU {mfu}; "
                                  f"{html.escape(pred.gpus)}")
            self.assumptions.value = ("<details open><summary>assumptions</summary><ul>"
                                      + "".join(f"<li>{html.escape(a)}</li>" for a in pred.assumptions)
                                      + "</ul></details>")

    def _draw_local_steps(self) -> None:
        """The Lab's latest measured step, and the same run predicted on this-cpu, as rows of the timeline."""
        if self.local is None or self.local[0] is None:
            return
        result, pred, _ = self.local
        if result.step_ms is not None:
            self.timeline.add_bar(name="measured step here", x=[result.step_ms.median], y=["measured here"],
                                  orientation="h")
        if pred is not None:
            self.timeline.add_bar(name="predicted on this-cpu", x=[pred.step_s * 1e3], y=["predicted here"],
                                  orientation="h")

    def _measured_memory(self):
        """("measured here", {label: GiB}) of the Lab's latest result, or None."""
        if self.local is None or self.local[0] is None:
            return None
        result = self.local[0]
        parts = result.memory_breakdown()
        if parts is None:
            if not result.peak_mem_bytes:
                return None
            return "measured here (peak)", {"activations": result.peak_mem_bytes / GIB}
        names = dict(MEMORY_PARTS)
        return "measured here", {names[k]: v / GIB for k, v in parts.items() if k in names}

    def _local(self):
        """(the Lab's latest measured result or None, its prediction on this-cpu or None, the sentence said)."""
        if self.lab is None:
            return None
        result = next((r for _, r in reversed(self.lab.runs) if r.status in ("ok", "stopped", "diverged")), None)
        if result is None:
            return None, None, "No run measured in this Lab yet: press Run, and its figures appear here beside the prediction."
        step = f"{result.step_ms.median:,.2f} ms" if result.step_ms is not None else "not measured"
        peak = f"{result.peak_mem_bytes / MIB:,.1f} MiB" if result.peak_mem_bytes else "not measured"
        ranks = len(getattr(result, "per_rank", None) or []) or 1
        said = (f"Measured here ({html.escape(result.label)}, {ranks} rank{'s' if ranks > 1 else ''} on "
                f"{html.escape(result.device or 'this machine')}): step {step}, peak memory {peak}. ")
        if LOCAL not in PARTS:
            return result, None, said + ("this-cpu is not calibrated: run scalekit.calibrate() to predict this run "
                                         "on this machine beside it.")
        try:
            pred = predict(_run_config(result), f"{ranks}x{LOCAL}")
        except (ConfigError, KeyError, TypeError, ValueError) as exc:
            return result, None, said + f"Predicted on this-cpu: not predicted ({html.escape(str(exc))})."
        return result, pred, said + (f"Predicted for the same run on this-cpu (calibrated): step "
                                     f"{pred.step_s * 1e3:,.2f} ms, peak memory {pred.memory['peak'] / MIB:,.1f} MiB.")


def model_toggles(toggles: dict) -> dict:
    """Of a run's toggles, those the view has a control for (the rest change no term of the prediction)."""
    kept = {"ddp", "fsdp", "zero", "tensor_parallel", "pipeline_parallel", "checkpointing", "sdpa", *DTYPES}
    out = {k: v for k, v in toggles.items() if k in kept}
    if "checkpointing" in out and _checkpointing_value(out["checkpointing"]) not in dict(CHECKPOINTING).values():
        del out["checkpointing"]
    return out


def _checkpointing_value(value):
    return 1 if value is True else int(value) if str(value).isdigit() else value


def _run_config(result):
    """The RunConfig of the built-in GPT a result measured (predict takes it), or a ConfigError for any other."""
    from ..training.config import RunConfig

    cfg = result.config
    if cfg.get("preset") is None or cfg.get("custom_model") or cfg.get("model") not in (None, "gpt"):
        raise ConfigError("the run's model is not the built-in GPT: predict takes its shape by name or config")
    return RunConfig(preset=cfg["preset"], toggles=cfg.get("toggles") or {}, batch_size=cfg.get("batch_size"),
                     seq_len=cfg.get("seq_len"), device="cpu")


def _lab_model(lab):
    """What the model control names for a Lab: its preset (the built-in GPT), else None (predict needs a shape)."""
    cfg = lab.base_config
    return None if cfg.custom_model else cfg.resolve(lab.hw).preset


def _split_gpus(spec: str) -> tuple[int, str]:
    from ..predict import gpus

    cluster = gpus(spec)
    return cluster.count, cluster.part.name


def _controls_of(toggles, count: int = 1) -> dict:
    """The controls' values for `toggles` (as RunConfig takes them); toggles the view has no control for are refused."""
    from ..predict.inputs import toggles_of
    from ..toggles.pipeline_parallel import parse as parse_pp
    from ..toggles.tensor_parallel import parse as parse_tp

    t = toggles_of(toggles)
    tp = parse_tp(2 if t.get("tensor_parallel") is True else t.get("tensor_parallel", 1))[0]
    out = dict(sharding="none", tensor=1, stages=1, schedule="1f1b", micro_batches=4, dtype="fp32",
               checkpointing=None, sdpa=False)
    for name, value in t.items():
        if name in ("ddp", "fsdp"):
            out["sharding"] = name
        elif name == "zero":
            out["sharding"] = "zero1" if value is True else str(value)
        elif name == "tensor_parallel":
            out["tensor"] = parse_tp(2 if value is True else value)[0]
        elif name == "pipeline_parallel":
            schedule, micro, stages = parse_pp("1f1b" if value is True else value)
            out.update(schedule=schedule if schedule in SCHEDULES else "1f1b", micro_batches=micro,
                       stages=stages or max(1, count // tp))  # without ',stages=S': every GPU tensor_parallel leaves
        elif name in DTYPES:
            out["dtype"] = name
        elif name == "checkpointing":
            value = _checkpointing_value(value)
            if value not in dict(CHECKPOINTING).values():
                raise ConfigError(f"AtScale: checkpointing={value!r} has no control here (off, 1, 2, 'selective')")
            out["checkpointing"] = value
        elif name == "sdpa":
            out["sdpa"] = True
        else:
            raise ConfigError(f"AtScale: the toggle {name!r} has no control in the at-scale view (it offers fsdp, "
                              f"ddp, zero, tensor_parallel, pipeline_parallel, bf16/fp16/tf32, checkpointing, sdpa)")
    return out


__all__ = ["AtScale", "toggles_of", "model_toggles", "memory_rows", "timeline_rows"]
