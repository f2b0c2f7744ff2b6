"""The Lab's generation mode, `Lab(task="generate")`: switch inference optimizations, watch tokens arrive.

    lab = Lab(task="generate")     # the shipped model; or Lab(task="generate", model="gpt2-124m", ...)
    lab                            # inference toggles, a prompt, Run/Stop, live latency and tokens/s, the text
    lab.results                    # decode tokens/s, speed-up, weight and KV-cache MB, perplexity, agreement

Each Run builds the model fresh with the chosen toggles and calls `scalekit.generate` in a background
thread; the generated text appears as it is produced, and a view thread redraws plots and text at most
`updates_per_s` times a second.  Stop ends the generation before its next token and keeps what it made.
Whatever a run raises, the controls come back in a `finally`.
"""

from __future__ import annotations

import dataclasses
import html
import json
import threading
import traceback

import ipywidgets as w

from ..engine import plain_error
from ..errors import ConfigError
from ..files import check_writable, write_atomic
from ..hardware import detect
from ..inference import GenerateConfig, GenerateResult, TokenRecord, generate
from ..toggles import ORDER
from .generate_plots import GenerationPlots
from .generate_table import results_frame, results_html
from .panel import TogglePanel


class GenerateLab:
    """Inference toggles, a prompt, Run/Stop, live per-token plots, the text as it comes, a results table."""

    def __init__(self, model="shakespeare-char", *, prompts="ROMEO:", max_new_tokens: int = 200,
                 device: str = "auto", updates_per_s: float = 4.0, hw=None, **config):
        self.base_config = GenerateConfig(model=model, prompts=prompts, max_new_tokens=max_new_tokens, device=device,
                                          **config)
        if isinstance(updates_per_s, bool) or not isinstance(updates_per_s, (int, float)) or not 0 < updates_per_s <= 60:
            raise ConfigError(f"Lab.updates_per_s must be a number in (0, 60] (redraws per second), got {updates_per_s!r}")
        self.hw = hw or detect(device)
        self.update_interval_s = 1.0 / updates_per_s
        self.runs: list[tuple[int, GenerateResult]] = []
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._number = 0
        self._lock = threading.Lock()
        self._texts: list[str] = []  # the text of the run going on, one per prompt, grown as tokens come
        self._tokens_seen = 0
        self._status_text = "ready"
        self._make_widgets()
        self.widget = self._layout()

    def _make_widgets(self) -> None:
        cfg = self.base_config
        self.panel = TogglePanel(self.hw, custom_model=cfg.custom_model,
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
        self.run_button = w.Button(description="Run", button_style="success", icon="play")
        self.stop_button = w.Button(description="Stop", button_style="danger", icon="stop", disabled=True)
        self.csv_button = w.Button(description="Save CSV", icon="download")
        self.json_button = w.Button(description="Save JSON", icon="download")
        self.progress = w.IntProgress(value=0, min=0, max=cfg.max_new_tokens, layout=w.Layout(width="240px"))
        self.status = w.HTML("ready")
        self.message = w.HTML("")
        self.text = w.HTML("", layout=w.Layout(width="920px"))
        self.text.add_class("scalekit-generated")
        self.plots = GenerationPlots()
        self.table = w.HTML(results_html(results_frame([])))
        self.table.add_class("scalekit-table")
        self.log = w.Output()
        self.run_button.on_click(self._guard(lambda _: self.start()))
        self.stop_button.on_click(self._guard(lambda _: self.stop()))
        self.csv_button.on_click(self._guard(lambda _: self._say(f"Saved {self.to_csv('scalekit-generate.csv')}")))
        self.json_button.on_click(self._guard(lambda _: self._say(f"Saved {self.to_json('scalekit-generate.json')}")))

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

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)

    # -- what a user (or a test) drives ------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def set(self, **values) -> None:
        """Set controls by name, e.g. lab.set(kv_cache="static", quantize="hqq-4bit"); False is off."""
        for key, value in values.items():
            if key not in self.controls:
                raise KeyError(f"no control {key!r}; controls: {', '.join(self.controls)}")
            self.controls[key].set(value)

    def config(self) -> GenerateConfig:
        """The GenerateConfig the next Run would measure."""
        prompts = self.base_config.prompts if self._fixed_prompts else [self.prompt.value]
        return dataclasses.replace(self.base_config, toggles=self.panel.selected(), prompts=prompts,
                                   max_new_tokens=self.max_new_tokens.value, temperature=self.temperature.value,
                                   label=None)

    def start(self) -> bool:
        """What Run does: a generation of the current selection in the background; False if none started."""
        if self.running:
            return False
        try:
            cfg = self.config()
            cfg.check_available(self.hw)
        except Exception as exc:
            self._say(f"Cannot run this: {plain_error(exc)}", error=True)
            return False
        self._number += 1
        self._stop.clear()
        self._texts = [self._prompt_text(cfg, i) for i in range(len(cfg.prompts))]
        self._tokens_seen = 0
        self.progress.max, self.progress.value = cfg.max_new_tokens, 0
        self._say("")
        self._lock_controls(True)
        self._thread = threading.Thread(target=self._work, args=(self._number, cfg), daemon=True,
                                        name=f"scalekit-generate-{self._number}")
        self._thread.start()
        return True

    def stop(self) -> None:
        """What Stop does: the generation ends before its next token; what it made is kept, marked stopped."""
        self._stop.set()
        self.stop_button.disabled = True

    def wait(self, timeout: float | None = None) -> GenerateResult | None:
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise TimeoutError(f"the generation did not finish within {timeout} s")
        return self.runs[-1][1] if self.runs else None

    @property
    def results(self):
        """The results table as a DataFrame: one row per generation that produced tokens (ok or stopped)."""
        return results_frame([(n, r) for n, r in self.runs if r.status in ("ok", "stopped")])

    def to_csv(self, path) -> str:
        frame = self.results
        write_atomic(check_writable(path, "Lab.to_csv path"), lambda f: frame.to_csv(f, index=False))
        return str(path)

    def to_json(self, path) -> str:
        doc = {"results": json.loads(self.results.to_json(orient="records")),
               "runs": [dict(number=n, **r.to_dict()) for n, r in self.runs]}
        write_atomic(check_writable(path, "Lab.to_json path"), lambda f: json.dump(doc, f, indent=2, default=str))
        return str(path)

    # -- the generation's thread and the view's thread -------------------------------------------------
    def _work(self, number: int, cfg: GenerateConfig) -> None:
        key = f"#{number} {cfg.label or cfg.describe()}"
        done = threading.Event()
        view = threading.Thread(target=self._view, args=(done,), daemon=True, name=f"scalekit-generate-view-{number}")
        view.start()
        result = None
        try:
            result = generate(cfg, on_token=lambda record: self._on_token(key, record),
                              on_status=lambda text: setattr(self, "_status_text", f"{key}: {text}"),
                              stop=self._stop, hw=self.hw, catch_errors=True)
        except BaseException as exc:  # anything a generation can raise, SystemExit from a user's model included
            result = GenerateResult(label=cfg.label or cfg.describe(), config=cfg.to_dict(), status="failed",
                                    error=plain_error(exc), device=self.hw.device_name)
        finally:
            done.set()
            view.join()
            try:
                self._finish(number, key, result)
            except BaseException:
                self.log.append_stderr(traceback.format_exc())
            finally:
                self._lock_controls(False)  # the Lab stays usable, whatever happened

    def _on_token(self, key: str, record: TokenRecord) -> None:
        self.plots.add(key, record)
        with self._lock:
            for i, piece in enumerate(record.texts):
                self._texts[i] += piece
            self._tokens_seen = record.index + 1

    def _view(self, done: threading.Event) -> None:
        shown = None
        while True:
            finished = done.wait(self.update_interval_s)
            try:
                self.plots.flush()
                with self._lock:
                    text, seen = "\n\n".join(self._texts), self._tokens_seen
                if text != shown:
                    self.text.value, shown = _pre(text), text
                self.progress.value = min(seen, self.progress.max)
                self.status.value = html.escape(self._status_text)
            except Exception:
                self.log.append_stderr(traceback.format_exc())
            if finished:
                return

    def _finish(self, number: int, key: str, result: GenerateResult) -> None:
        self.runs.append((number, result))
        if result.status == "failed":
            self._say(f"Run {key} failed: {result.error}. The Lab is ready for the next run.", error=True)
        elif result.status == "stopped":
            self._say(f"Run {key} stopped after {result.new_tokens} tokens; kept in the table as stopped.")
        if result.texts:
            self.text.value = _pre("\n\n".join(result.texts))
        self.table.value = results_html(self.results)
        rate = f", {result.decode_tokens_per_s:,.0f} decode tokens/s" if result.decode_tokens_per_s else ""
        self.status.value = html.escape(f"{key}: {result.status}{rate}")

    # -- small helpers -----------------------------------------------------------------------------
    @staticmethod
    def _prompt_text(cfg: GenerateConfig, i: int) -> str:
        p = cfg.prompts[i]
        return p if isinstance(p, str) else cfg.get_tokenizer().decode(p) if cfg.tokenizer else ""

    def _lock_controls(self, locked: bool) -> None:
        self.panel.set_locked(locked)
        self.run_button.disabled = locked
        self.stop_button.disabled = not locked
        self.max_new_tokens.disabled = self.temperature.disabled = locked
        self.prompt.disabled = locked or self._fixed_prompts

    def _say(self, text: str, error: bool = False) -> None:
        colour = "#b91c1c" if error else "#374151"
        self.message.value = f"<span style='color:{colour}'>{html.escape(text)}</span>" if text else ""

    def _guard(self, handler):
        def wrapped(button):
            try:
                handler(button)
            except Exception as exc:
                self._say(plain_error(exc), error=True)
                self.log.append_stderr(traceback.format_exc())
        return wrapped


def _pre(text: str) -> str:
    return f"<pre style='white-space:pre-wrap;font-size:0.9em'>{html.escape(text)}</pre>"
