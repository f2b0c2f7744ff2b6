"""The Lab's live plots: throughput, memory and loss per step, one named trace per run (see live.py)."""

from __future__ import annotations

from ..training.results import StepRecord
from .live import LiveSeries, figure

MB = 2**20


class LivePlots(LiveSeries):
    def __init__(self, device_type: str = "cpu"):
        memory_title = "allocated (MB)" if device_type == "cuda" else "process RSS (MB)"
        self.throughput = figure("Throughput (tokens/s)", "step", "tokens/s", "scalekit-throughput", 920)
        self.memory = figure("Memory (MB)", "step", memory_title, "scalekit-memory", 460)
        self.loss = figure("Loss", "step", "loss", "scalekit-loss", 460)
        super().__init__({"throughput": self.throughput, "memory": self.memory, "loss": self.loss},
                         mode="lines+markers", marker=dict(size=4))

    def points(self, record: StepRecord) -> tuple[int, list[tuple[str, float]]]:
        """One step: its throughput, and its memory and loss where that step measured them."""
        points = [("throughput", record.tokens_per_s)]
        if record.mem_bytes is not None:
            points.append(("memory", record.mem_bytes / MB))
        if record.loss is not None:
            points.append(("loss", record.loss))
        return record.step, points

    def widget(self):
        import ipywidgets as w

        return w.VBox([self.throughput, w.HBox([self.memory, self.loss])])
