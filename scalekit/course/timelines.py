"""Figures of memory over a training step (scalekit/measure/memory_timeline.py): one panel per timeline, the
categories stacked, the phases shaded.  plotly is imported only when a figure is built."""

from __future__ import annotations

from ..measure.memory_timeline import CATEGORIES, Timeline

COLORS = {"parameters": "#4C78A8", "gathered parameters": "#72B7B2", "gradients": "#F58518",
          "optimizer state": "#54A24B", "activations": "#E45756", "temporaries": "#B279A2"}
PHASE_SHADES = {"forward": "rgba(76,120,168,0.07)", "backward": "rgba(228,87,86,0.07)",
                "optimizer": "rgba(84,162,75,0.07)"}
MIB = 2**20


def memory_timeline_figure(timelines: dict[str, Timeline], title: str = "Memory through one training step"):
    """Stacked areas of each category's MiB after every op, one panel per labelled timeline (shared y axis),
    the forward, backward and optimizer phases shaded and named."""
    from plotly.subplots import make_subplots

    labels = list(timelines)
    fig = make_subplots(rows=len(labels), cols=1, shared_yaxes=True, subplot_titles=labels, vertical_spacing=0.12)
    shown = set()
    for row, label in enumerate(labels, start=1):
        timeline = timelines[label]
        x = list(range(len(timeline.ops)))
        for category in CATEGORIES:
            if not any(timeline.bytes[category]) and category == "gathered parameters":
                continue
            fig.add_scatter(x=x, y=[b / MIB for b in timeline.bytes[category]], name=category, stackgroup=str(row),
                            mode="lines", line=dict(width=0.5, color=COLORS[category]), legendgroup=category,
                            showlegend=category not in shown, row=row, col=1, customdata=timeline.ops,
                            hovertemplate=category + ": %{y:.2f} MiB<br>op %{x}: %{customdata}<extra></extra>")
            shown.add(category)
        for phase, first, last in timeline.phase_spans():
            if last - first >= len(x) // 50:  # name the long stretches; a 2-op stretch is shaded unnamed
                fig.add_vrect(x0=first - 0.5, x1=last + 0.5, fillcolor=PHASE_SHADES[phase], line_width=0,
                              annotation_text=phase, annotation_position="top left", row=row, col=1)
            else:
                fig.add_vrect(x0=first - 0.5, x1=last + 0.5, fillcolor=PHASE_SHADES[phase], line_width=0,
                              row=row, col=1)
        fig.update_yaxes(title_text="MiB", row=row, col=1)
    fig.update_xaxes(title_text="op in the step (one point after each)", row=len(labels), col=1)
    fig.update_layout(title=title, height=260 * len(labels) + 120, legend_title_text="held by",
                      margin=dict(t=70, b=40))
    return fig
