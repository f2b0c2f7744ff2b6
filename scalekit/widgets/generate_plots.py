"""The generation Lab's live plots: per-token latency, tokens/s and (speculative decoding) the draft tokens each
verification kept, against the token index, a trace per run.

As in the training Lab: the shared live series (live.py) buffer and draw; this says the figures and points.
"""

from __future__ import annotations

from ..inference.results import TokenRecord
from .live import LiveSeries, figure


class GenerationPlots(LiveSeries):
    def __init__(self):
        self.latency = figure("Per-token latency (ms)", "new token", "ms", "scalekit-latency", 460)
        self.rate = figure("Tokens/s (batch × 1000 / ms)", "new token", "tokens/s", "scalekit-token-rate", 460)
        # speculative decoding: the draft tokens kept by the verification that made each token (0 to k)
        self.accepted = figure("Draft tokens kept per verification", "new token", "kept", "scalekit-accepted", 460)
        super().__init__({"latency": self.latency, "rate": self.rate, "accepted": self.accepted}, mode="lines",
                         line=dict(width=1))

    def points(self, record: TokenRecord) -> tuple[int, list[tuple[str, float]]]:
        """One new token (index 0 is the first token, after the prefill: not a decode step, not drawn)."""
        if record.index == 0 or not record.ms:
            return record.index, []
        kept = [] if record.accepted is None else [("accepted", float(record.accepted))]
        return record.index, [("latency", record.ms), ("rate", len(record.token_ids) * 1e3 / record.ms), *kept]

    def widget(self):
        import ipywidgets as w

        return w.VBox([w.HBox([self.latency, self.rate]), self.accepted])
