"""The Lab's generation mode, `Lab(task="generate")`: switch inference optimizations, watch tokens arrive.

    lab = Lab(task="generate")     # the shipped model; or Lab(task="generate", model="gpt2-124m", ...)
    lab                            # inference toggles, a prompt, Run/Stop, live latency and tokens/s, the text
    lab.results                    # decode tokens/s, speed-up, weight and KV-cache MB, perplexity, agreement

Each Run builds the model fresh with the chosen toggles and calls `scalekit.generate` in a background
thread; the generated text appears as it is produced, and a view thread redraws plots and text at most
`updates_per_s` times a second.  Stop ends the generation before its next token and keeps what it made.
Whatever a run raises, the controls come back in a `finally`.  The threads, Run/Stop, the status line,
the error capture and the save buttons are the base both Labs share (runner.py); this file holds the
generation's own: its controls, its config, the text as tokens come.
"""

from __future__ import annotations

import dataclasses
import html
import threading

import ipywidgets as w

from ..inference import GenerateConfig, GenerateResult, TokenRecord, generate
from ..toggles import ORDER
from .generate_plots import GenerationPlots
from .generate_table import results_frame, results_html
from .panel import TogglePanel
from .runner import Runner


class GenerateLab(Runner):
    """Inference toggles, a prompt, Run/Stop, live per-token plots, the text as it comes, a results table."""

    result_type = GenerateResult
    shown_statuses = ("ok", "stopped")  # a generation that produced tokens
    export_name = "scalekit-generate"
    thread_name = "scalekit-generate"
    _frame = staticmethod(results_frame)
    _html = staticmethod(results_html)

    def __init__(self, model="shakespeare-char", *, prompts="ROMEO:", max_new_tokens: int | None = None,
                 device: str = "auto", updates_per_s: float = 4.0, hw=None, **config):
        self.base_config = GenerateConfig(model=model, prompts=prompts, max_new_tokens=max_new_tokens, device=device,
                                          **config)
        super().__init__(hw, device, updates_per_s)  # Run/Stop, status, messages, the table, save buttons
        self._lock = threading.Lock()
        self._texts: list[str] = []  # the text of the run going on, one per prompt, grown as tokens come
        self._tokens_seen = 0
        self._text_shown = None  # the text the view last drew
        self._make_widgets()
        self.widget = self._layout()

    def _make_widgets(self) -> None:
        cfg = self.base_config
        self.panel = TogglePanel(self.hw, custom_model=cfg.custom_model, adapter=cfg.family(), loop="generate",
                                 toggles=tuple(t for t in ORDER if "generate" in t.loops))
        self.controls = self.panel.controls
        self.panel.preselect(cfg.toggles)
        first = cfg.prompts[0] if isinstance(cfg.prompts[0], str) else ""
        # a batch of prompts, or token ids, are the config's: the box shows one text prompt to edit
        self._fixed_prompts = not isinstance(cfg.prompts[0], str) or len(cfg.prompts) > 1
        self.prompt = w.Textarea(value=first, description="prompt", layout=w.Layout(width="460px", height="60px"),
                                 disabled=self._fixed_prompts)
        self.max_new_tokens = w.BoundedIntText(value=cfg.max_new_tokens, min=1, max=10**6, description="new tokens",
                                               style={"description_width": "initial"}, layout=w.Layout(width="200px"))
        self.temperature = w.BoundedFloatText(value=cfg.temperature, min=0.0, max=100.0, step=0.1,
                                              description="temperature", style={"description_width": "initial"},
                                              layout=w.Layout(width="200px"))
        self.progress.max = cfg.max_new_tokens
        self.text = w.HTML("", layout=w.Layout(width="920px"))
        self.text.add_class("scalekit-generated")
        self.plots = GenerationPlots()

    def _layout(self) -> w.VBox:
        model = self.base_config.model if isinstance(self.base_config.model, str) else "your model"
        header = w.HTML(f"<b>scalekit Lab — generation</b>: {html.escape(str(model))} on "
                        f"{html.escape(self.hw.device_name)}")
        widget = w.VBox([header, self.panel.widget, self.prompt,
                         w.HBox([self.run_button, self.stop_button, self.max_new_tokens, self.temperature]),
                         w.HBox([self.progress, self.status]), self.message, self.plots.widget(), self.text,
                         self.table, w.HBox([self.csv_button, self.json_button]), self.log])
        widget.add_class("scalekit-lab")
        return widget

    # -- what a user (or a test) drives ------------------------------------------------------------
    def config(self) -> GenerateConfig:
        """The GenerateConfig the next Run would measure."""
        prompts = self.base_config.prompts if self._fixed_prompts else [self.prompt.value]
        return dataclasses.replace(self.base_config, toggles=self.panel.selected(), prompts=prompts,
                                   max_new_tokens=self.max_new_tokens.value, temperature=self.temperature.value,
                                   label=None)

    # -- the generation's parts of a run ---------------------------------------------------------------
    def _checked_config(self) -> GenerateConfig:
        cfg = self.config()
        cfg.check_available(self.hw)  # a prompt the tokenizer cannot encode, a toggle this device lacks
        return cfg

    def _prepare(self, cfg: GenerateConfig) -> None:
        self._texts = [self._prompt_text(cfg, i) for i in range(len(cfg.prompts))]
        self._tokens_seen = 0
        self._text_shown = None  # the new run's text is drawn at the first redraw, whatever was shown before
        self.progress.max, self.progress.value = cfg.max_new_tokens, 0

    def _progress_now(self) -> int:
        return self._tokens_seen

    def _measure(self, cfg: GenerateConfig, key: str) -> GenerateResult:
        """In the run's thread: `scalekit.generate`, its tokens to the plots and the text."""
        return generate(cfg, on_token=lambda record: self._on_token(key, record),
                        on_status=lambda text: self._note_status(f"{key}: {text}"),
                        stop=self._stop, hw=self.hw, catch_errors=True)

    def _on_token(self, key: str, record: TokenRecord) -> None:
        self.plots.add(key, record)
        with self._lock:
            for i, piece in enumerate(record.texts):
                self._texts[i] += piece
            self._tokens_seen = record.index + 1

    def _redraw_own(self) -> bool:
        """The text so far, when it grew."""
        with self._lock:
            text = "\n\n".join(self._texts)
        if text == self._text_shown:
            return False
        self.text.value, self._text_shown = _pre(text), text
        return True

    def _say_outcome(self, key: str, result: GenerateResult) -> None:
        if result.status == "stopped":
            self._say(f"Run {key} stopped after {result.new_tokens} tokens; kept in the table as stopped.")

    @staticmethod
    def _rate(result: GenerateResult) -> str:
        return f", {result.decode_tokens_per_s:,.0f} decode tokens/s" if result.decode_tokens_per_s else ""

    def _show_result(self, result: GenerateResult) -> None:
        if result.texts:
            self.text.value = _pre("\n\n".join(result.texts))

    # -- small helpers -----------------------------------------------------------------------------
    @staticmethod
    def _prompt_text(cfg: GenerateConfig, i: int) -> str:
        p = cfg.prompts[i]
        return p if isinstance(p, str) else cfg.get_tokenizer().decode(p) if cfg.tokenizer else ""

    def _lock_controls(self, locked: bool) -> None:
        super()._lock_controls(locked)
        self.max_new_tokens.disabled = self.temperature.disabled = locked
        self.prompt.disabled = locked or self._fixed_prompts


def _pre(text: str) -> str:
    return f"<pre style='white-space:pre-wrap;font-size:0.9em'>{html.escape(text)}</pre>"
