"""Figures for measured and planned memory, and for where a step's time goes.  plotly is imported only when
a figure is built."""

from __future__ import annotations

from collections.abc import Iterable

PARTS = ("params", "grads", "optimizer_state", "activations")
PART_NAMES = {"params": "parameters", "grads": "gradients", "optimizer_state": "optimizer state",
              "activations": "activations (peak − the rest)"}
PART_COLORS = {"params": "#4C78A8", "grads": "#F58518", "optimizer_state": "#54A24B", "activations": "#E45756"}
MIB = 2**20


def breakdown_rows(items) -> list[tuple[str, dict[str, int]]]:
    """(bar label, {part: bytes}) for RunResults (measured), Estimates (planned) or (label, dict) pairs."""
    from ..plan import Estimate

    if not isinstance(items, (list, tuple)) or (len(items) == 2 and isinstance(items[0], str)):
        items = [items]
    rows = []
    for item in items:
        if isinstance(item, tuple):
            label, parts = item
        elif isinstance(item, Estimate):
            label, parts = f"{item.label} (planned)", item.memory_breakdown()
        else:  # a RunResult
            parts = item.memory_breakdown()
            if parts is None:
                raise ValueError(f"run {item.label!r} has no measured memory breakdown (status {item.status!r}; "
                                 f"on CPU it needs measure_memory=True)")
            label = f"{item.label} (measured)"
        rows.append((label, {p: int(parts[p]) for p in PARTS}))
    return rows


def memory_breakdown_figure(results_or_estimates: Iterable, title: str = "Memory at the peak of a training step"):
    """A stacked bar per run or estimate: parameters, gradients, optimizer state, activations (MiB)."""
    import plotly.graph_objects as go

    rows = breakdown_rows(results_or_estimates)
    labels = [label for label, _ in rows]
    fig = go.Figure()
    for part in PARTS:
        mib = [parts[part] / MIB for _, parts in rows]
        fig.add_bar(name=PART_NAMES[part], x=labels, y=mib, marker_color=PART_COLORS[part],
                    hovertemplate="%{x}<br>" + PART_NAMES[part] + ": %{y:.1f} MiB<extra></extra>")
    peaks = [sum(parts.values()) / MIB for _, parts in rows]
    fig.add_scatter(x=labels, y=peaks, mode="text", text=[f"{p:.1f} MiB" for p in peaks], textposition="top center",
                    showlegend=False, hoverinfo="skip")
    fig.update_layout(barmode="stack", title=title, yaxis_title="MiB", legend_title_text="part",
                      margin=dict(t=60, b=40), height=420)
    return fig


STEP_PARTS = {"data_wait": ("waiting for data", "#E45756"), "compute": ("compute (the rest of the step)", "#4C78A8")}


def step_time_rows(results) -> list[tuple[str, dict[str, float]]]:
    """(label, {data_wait, compute}) in ms per step (means over the measured steps) for runs that measured it."""
    rows = []
    for r in results:
        steps = [s for s in r.steps if not s.warmup and s.data_wait_ms is not None]
        if not steps:
            continue
        wait = sum(s.data_wait_ms for s in steps) / len(steps)
        rows.append((r.label, {"data_wait": wait, "compute": sum(s.step_ms for s in steps) / len(steps) - wait}))
    return rows


def step_time_figure(results_or_rows, title: str = "Time per step: waiting for data, and the rest"):
    """A stacked bar per run: the mean step split into the wait for its batch and the rest (ms), so a
    data-bound run stands out at a glance."""
    import plotly.graph_objects as go

    items = list(results_or_rows)
    rows = items if items and isinstance(items[0], tuple) else step_time_rows(items)
    labels = [label for label, _ in rows]
    fig = go.Figure()
    for part, (name, colour) in STEP_PARTS.items():
        fig.add_bar(name=name, x=labels, y=[parts[part] for _, parts in rows], marker_color=colour,
                    hovertemplate="%{x}<br>" + name + ": %{y:.2f} ms<extra></extra>")
    shares = [parts["data_wait"] / max(1e-12, parts["data_wait"] + parts["compute"]) for _, parts in rows]
    fig.add_scatter(x=labels, y=[sum(parts.values()) for _, parts in rows], mode="text", showlegend=False,
                    text=[f"{100 * share:.0f}% waiting" for share in shares], textposition="top center",
                    hoverinfo="skip")
    fig.update_layout(barmode="stack", title=title, yaxis_title="ms per step", legend_title_text="part",
                      margin=dict(t=60, b=40), height=380)
    return fig


def decode_growth_figure(results, kv_bytes: dict, title: str = "Generating token after token: time and KV cache"):
    """Two panels against tokens generated: the cumulative decode time of each generation (s), and the bytes its
    KV cache holds (`kv_bytes`: label → bytes after each token).  Without a cache every step re-reads the whole
    sequence, so its cumulative time bends upward (quadratic); with one it grows in a straight line."""
    import itertools

    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("cumulative decode time (s)", "KV cache (MiB)"))
    colours = itertools.cycle(["#E45756", "#4C78A8", "#54A24B", "#F58518", "#B279A2"])
    for r in results:
        colour = next(colours)
        total = list(itertools.accumulate(ms / 1e3 for ms in r.token_ms))
        tokens = list(range(2, len(total) + 2))  # decode step i makes token i + 1 (the first came from the prefill)
        fig.add_scatter(x=tokens, y=total, name=r.label, mode="lines", line_color=colour, legendgroup=r.label,
                        row=1, col=1)
        held = kv_bytes.get(r.label)
        if held is not None:
            fig.add_scatter(x=list(range(1, len(held) + 1)), y=[b / MIB for b in held], name=r.label, mode="lines",
                            line_color=colour, legendgroup=r.label, showlegend=False, row=1, col=2)
    fig.update_xaxes(title_text="tokens generated")
    fig.update_layout(title=title, height=360, margin=dict(t=70, b=40))
    return fig


def step_curves_figure(results, title: str = "Step time and loss, step by step"):
    """Two panels side by side, a line per run: each measured step's time (ms), and the loss where it was read
    (warm-up steps included, marked by a dotted line at the first measured step)."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("ms per measured step", "loss"), horizontal_spacing=0.1)
    colours = ["#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#B279A2"]
    first_measured = None
    for i, r in enumerate(results):
        colour = colours[i % len(colours)]
        steps = [s for s in r.steps if not s.warmup]
        if steps:
            first_measured = steps[0].step if first_measured is None else min(first_measured, steps[0].step)
        fig.add_scatter(x=[s.step for s in steps], y=[s.step_ms for s in steps], name=r.label, legendgroup=r.label,
                        mode="lines+markers", line_color=colour, row=1, col=1,
                        hovertemplate="step %{x}: %{y:.1f} ms<extra>" + r.label + "</extra>")
        fig.add_scatter(x=[step for step, _ in r.losses], y=[loss for _, loss in r.losses], name=r.label,
                        legendgroup=r.label, showlegend=False, mode="lines+markers", line_color=colour, row=1, col=2,
                        hovertemplate="step %{x}: loss %{y:.3f}<extra>" + r.label + "</extra>")
    if first_measured is not None:
        fig.add_vline(x=first_measured - 0.5, line_dash="dot", line_color="#9ca3af", row=1, col=2)
    fig.update_xaxes(title_text="step")
    fig.update_yaxes(title_text="ms", row=1, col=1)
    fig.update_yaxes(title_text="loss", row=1, col=2)
    fig.update_layout(title=title, height=360, margin=dict(t=70, b=40), template="plotly_white")
    return fig


def heldout_curves_figure(curves: dict, before: float | None = None,
                          title: str = "Held-out loss during fine-tuning"):
    """A line per method: held-out loss (nats per token) against training steps, from {label: [(step, loss),
    ...]} (scalekit.training.finetune.heldout_curve); `before`, the pretrained model's loss, as a dotted line."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for label, points in curves.items():
        fig.add_scatter(x=[s for s, _ in points], y=[v for _, v in points], mode="lines+markers", name=label,
                        hovertemplate=label + "<br>step %{x}: %{y:.4f}<extra></extra>")
    if before is not None:
        fig.add_hline(y=before, line_dash="dot", line_color="grey", annotation_text=f"before {before:.3f}",
                      annotation_position="top right")
    fig.update_layout(title=title, xaxis_title="training step", yaxis_title="held-out loss (nats per token)",
                      legend_title_text="method", margin=dict(t=60, b=40), height=420)
    return fig


PASS_COLORS = {"forward": "#4C78A8", "backward": "#F58518"}


def pipeline_timeline_figure(timelines: dict, title: str = "A pipeline step as it ran: stage × time"):
    """One panel per schedule (`timelines`: name -> scalekit.distributed.timeline.Timeline of one step): a row per
    stage, a bar per micro-batch's forward (blue) or backward (orange) from its recorded start to its end, the
    micro-batch's number on it; the gaps are the stage waiting (the bubble, and the sends and receives)."""
    from plotly.subplots import make_subplots

    names = list(timelines)
    fig = make_subplots(rows=len(names), cols=1, shared_xaxes=True, vertical_spacing=0.12,
                        subplot_titles=[f"{n}: {timelines[n].span_ms():.0f} ms, idle {timelines[n].idle_share():.0%}"
                                        for n in names])
    for row, name in enumerate(names, start=1):
        passes = timelines[name].rows()
        for kind, colour in PASS_COLORS.items():
            mine = [p for p in passes if p["kind"] == kind]
            fig.add_bar(orientation="h", name=kind, legendgroup=kind, showlegend=row == 1, marker_color=colour,
                        y=[f"stage {p['stage']} (rank {p['rank']})" for p in mine],
                        base=[p["start_ms"] for p in mine], x=[p["end_ms"] - p["start_ms"] for p in mine],
                        text=[str(p["micro_batch"]) for p in mine], textposition="inside",
                        hovertemplate="%{y}<br>" + kind + " of micro-batch %{text}<br>%{base:.1f} ms + %{x:.1f} ms"
                                      "<extra></extra>", row=row, col=1)
        fig.update_yaxes(autorange="reversed", row=row, col=1)
    fig.update_xaxes(title_text="ms from the step's first forward", row=len(names), col=1)
    fig.update_layout(barmode="overlay", title=title, height=170 + 150 * len(names), margin=dict(t=80, b=40))
    return fig


BOUND_COLORS = {"compute": "#54A24B", "memory": "#4C78A8", "overhead": "#E45756"}
ROOF_COLORS = ["#111827", "#F58518", "#B279A2", "#72B7B2"]


def roofline_figure(roofs, ops_by_label: dict, overhead_s: float = 0.0, title: str = "The roofline",
                    symbols=("circle", "diamond", "square", "triangle-up")):
    """Log-log: each of `roofs` (scalekit.measure.roofline.Roof) as min(peak, intensity × bandwidth) with its
    ridge point marked; each operator of `ops_by_label` (label → OpCosts) as a point at its arithmetic intensity
    and the FLOP/s it reached, sized by its share of the time, coloured by what bounds it on the first roof
    (`overhead_s`: the cost of one operator).  Operators that do no arithmetic have no point (their time is
    data movement)."""
    import math

    import plotly.graph_objects as go

    points = {label: [o for o in ops if o.flops and o.nbytes and o.time_s] for label, ops in ops_by_label.items()}
    shown = [o for ops in points.values() for o in ops]
    xs = [o.intensity for o in shown] + [r.ridge for r in roofs]
    low, high = min(xs) / 4, max(xs) * 4
    longest = max((o.time_s for o in shown), default=1.0)
    fig = go.Figure()
    for i, roof in enumerate(roofs):
        colour = ROOF_COLORS[i % len(ROOF_COLORS)]
        grid = sorted({low, high, roof.ridge})
        fig.add_scatter(x=grid, y=[roof.attainable(x) for x in grid], mode="lines", name=roof.name,
                        line=dict(color=colour, width=2), hovertemplate="intensity %{x:.3g} FLOP/B: at most "
                        "%{y:.3g} FLOP/s<extra>" + roof.name + "</extra>")
        fig.add_scatter(x=[roof.ridge], y=[roof.peak_flops], mode="markers+text", showlegend=False,
                        marker=dict(color=colour, size=8, symbol="x"), text=[f"ridge {roof.ridge:.3g}"],
                        textposition="top left", hoverinfo="skip")
    for j, (label, ops) in enumerate(points.items()):
        kinds = [o.bound(roofs[0], overhead_s) for o in ops]
        fig.add_scatter(
            x=[o.intensity for o in ops], y=[o.flops_per_s for o in ops], mode="markers", name=label,
            marker=dict(size=[6 + 34 * math.sqrt(o.time_s / longest) for o in ops], opacity=0.7,
                        color=[BOUND_COLORS.get(k, "#9ca3af") for k in kinds], symbol=symbols[j % len(symbols)],
                        line=dict(color="#111827", width=0.5)),
            text=[f"{o.label}<br>{o.calls:g} calls, {o.time_s * 1e3:.3g} ms per step, {k}-bound"
                  for o, k in zip(ops, kinds, strict=True)],
            hovertemplate="%{text}<br>%{x:.3g} FLOP/B, %{y:.3g} FLOP/s<extra>" + label + "</extra>")
    fig.update_xaxes(type="log", title_text="arithmetic intensity (FLOPs per byte moved)")
    fig.update_yaxes(type="log", title_text="FLOP/s")
    fig.update_layout(title=title, height=460, margin=dict(t=60, b=50), template="plotly_white",
                      legend_title_text="colour: green compute-, blue memory-, red overhead-bound")
    return fig
