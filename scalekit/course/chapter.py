"""Small helpers the course notebooks share: pick sizes for the hardware, Before/After tables, and the sentence
that fits a measurement (so a chapter's prose never contradicts its table)."""

from __future__ import annotations

import contextlib
import html
import inspect
import logging
import math
import os
import re
import textwrap
import warnings

from ..inference.results import GenerateResult, compare_generations, generation_speedup
from ..machine.hardware import cuda_gpu_present
from ..measure.reliability import judged_sentence, unreliable_reason
from ..measure.stats import Interval
from ..toggles import TOGGLES
from ..training.results import RunResult, compare, speedup_over


def on_gpu() -> bool:
    """A usable CUDA GPU is present, found without creating a CUDA context (so notebooks can still fork ranks)."""
    return cuda_gpu_present()


def pick(cpu, gpu):
    """The CPU-sized value on a laptop or Binder, the full-size one on a GPU machine."""
    return gpu if on_gpu() else cpu


PLOT_RENDERER = "plotly_mimetype+notebook"


def setup_plots() -> None:
    """Make plotly figures render in JupyterLab and in a static HTML export of the executed notebook.

    JupyterLab draws plotly's mimetype; `jupyter nbconvert --to html` cannot, so each figure also carries
    HTML, with plotly.js embedded once per notebook instead of fetched from a CDN (works offline).  Returns
    nothing, so a chapter's first cell shows nothing."""
    import plotly.io as pio

    pio.renderers.default = PLOT_RENDERER


# Library chatter a reader should not have to read past: (category, message regex) pairs for `warnings`, and
# loggers turned down to errors.  Each is an announcement about the library, never about the reader's run.
QUIET_WARNINGS = [
    (UserWarning, r".*TypedStorage is deprecated.*"),
    (UserWarning, r".*torch\._dynamo.*"),
    (UserWarning, r".*Attempting to run cuBLAS.*"),
    (FutureWarning, r".*"),
    (DeprecationWarning, r".*"),
]
QUIET_LOGGERS = ["torch.utils._pytree", "transformers", "torch._dynamo", "torch._inductor", "torchao", "hqq", "peft", "accelerate",
                 "torch.distributed", "bitsandbytes"]


def setup_page() -> None:
    """A chapter's first cell: plots that render in the Lab and in static HTML (`setup_plots`), and library
    chatter (deprecation notices, dynamo and transformers log lines, optional-kernel load failures) kept off
    the page.  A warning about the reader's own run (a toggle that did not apply, a busy machine) still shows:
    those come from scalekit and are never silenced here.  Returns nothing, so the cell shows nothing."""
    setup_plots()
    for category, message in QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")


@contextlib.contextmanager
def quiet_output():
    """Swallow what a library prints to stdout/stderr from Python inside the block (a profiler's banner, an
    optional kernel's load failure), for a cell whose own output is the table that follows."""
    import io

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        yield


def _round(value, digits: int = 3):
    """`value` to `digits` significant figures, None/NaN as None (shown blank), anything else unchanged."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, float | int):
        if isinstance(value, float) and math.isnan(value):
            return None
        if value == 0:
            return 0
        places = digits - 1 - int(math.floor(math.log10(abs(value))))
        return round(value, places) if places > 0 else int(round(value, places))
    return value


def _speedup_text(row) -> str:
    if row.get("verdict") == "baseline":
        return "baseline"
    est, low, high = row.get("speedup"), row.get("speedup_low"), row.get("speedup_high")
    if est is None or (isinstance(est, float) and math.isnan(est)):
        return ""
    if low is None or (isinstance(low, float) and math.isnan(low)):
        return f"{est:.2f}×"
    return f"{est:.2f}× ({low:.2f}–{high:.2f})"


TABLE_COLUMNS = ("step_ms", "peak_mem_mb", "final_loss")  # a training table's columns besides run and speed-up
GENERATION_COLUMNS = ("decode_ms", "kv_cache_mb", "perplexity")


def table(results: list, columns=None, reference: dict | None = None, reference_name: str = "public figure",
          digits: int = 3):
    """A Before/After table a reader can take in: one row per run, the speed-up as 'est× (low–high)' with its
    verdict (faster / slower / within noise / unreliable (machine busy)), the chosen `columns` of `compare()`
    (or `compare_generations()` for generations), rounded to `digits` significant figures, and a public figure
    in a column beside its row (`reference`: run label → text or number; `reference_name` heads the column).  At
    most 8 columns, nothing truncated; a note (why two runs cannot be compared, a busy machine) is kept when any
    row has one."""
    import pandas as pd

    generation = bool(results) and isinstance(results[0], GenerateResult)
    full = compare_generations(results) if generation else compare(results)
    columns = list(columns or (GENERATION_COLUMNS if generation else TABLE_COLUMNS))
    unknown = [c for c in columns if c not in full.columns]
    if unknown:
        raise ValueError(f"table(columns=...) names {unknown}; the columns are: {', '.join(full.columns)}")
    out = pd.DataFrame({"run": full["run"]})
    out["speed-up (95%)"] = [_speedup_text(row) for row in full.to_dict("records")]
    out["verdict"] = full["verdict"].fillna("")
    full["note"] = _unreliable_rows(results, full, out)
    for c in columns:
        out[c] = [_round(v, digits) for v in full[c]]
    if reference is not None:
        out[reference_name] = [reference.get(r, "") for r in full["run"]]
    notes = full["note"].fillna("")
    if any(notes):
        out["note"] = notes
    if len(out.columns) > 8:  # run, speed-up, verdict + 5
        raise ValueError(f"table() would show {len(out.columns)} columns; a reader takes in 8 at most: pass fewer "
                         f"columns (now {columns})")
    return Table(out.set_index("run"))


def _unreliable_rows(results: list, full, out) -> list[str]:
    """Each row's note, with `finding`'s reason where it calls the row unreliable (its verdict then says so too):
    the table and the sentences under it never disagree."""
    notes = list(full["note"].fillna(""))
    base = next((r for r, v in zip(results, full["verdict"], strict=True) if v == "baseline"), None)
    for i, r in enumerate(results):
        if base is None or r is base:
            continue
        interval, _, (short, detail) = _compared(r, base)
        if short and interval is not None and short != "machine busy":
            out.loc[i, "verdict"] = f"unreliable ({short})"
            notes[i] = "; ".join(n for n in (notes[i], detail) if n)
    return notes


class Table:
    """A chapter's table: shown whole (no "…" for a long note or a wide row) in the Lab and in static HTML,
    without changing pandas' display options for the reader's own frames.  `.frame` is the DataFrame."""

    def __init__(self, frame):
        self.frame = frame

    def _repr_html_(self) -> str:
        import pandas as pd

        with pd.option_context("display.max_colwidth", None):  # pandas cuts a cell at 50 characters otherwise
            return self.frame.to_html(na_rep="", max_cols=None, max_rows=None, notebook=True)

    def __repr__(self) -> str:
        return self.frame.to_string(na_rep="", max_cols=None, max_rows=None, max_colwidth=None)

    def __getitem__(self, key):
        return self.frame[key]

    def __len__(self) -> int:
        return len(self.frame)


class Summary:
    """'What you measured': the reader's own numbers, a few lines, as Markdown (and HTML in a static export)."""

    def __init__(self, lines: list[str]):
        self.lines = [str(line) for line in lines]

    def _repr_markdown_(self) -> str:
        return "**What you measured**\n\n" + "\n".join(f"- {line}" for line in self.lines)

    def _repr_html_(self) -> str:
        items = "".join(f"<li>{html.escape(line)}</li>" for line in self.lines)
        return f"<p><strong>What you measured</strong></p><ul>{items}</ul>"

    def __repr__(self) -> str:
        return self._repr_markdown_()


def what_you_measured(*lines: str) -> Summary:
    """A chapter's closing summary: three or four lines built from the reader's own results (use `finding`)."""
    if not lines:
        raise ValueError("what_you_measured() needs at least one line")
    return Summary(list(lines))


def before_after(results: list[RunResult], reference_ms: dict[str, float] | None = None, reference_name: str = ""):
    """compare(results), plus the public reference step time and speed-up beside each row where one exists."""
    df = compare(results)
    if reference_ms:
        base = reference_ms.get("baseline")
        col = f"reference ms ({reference_name})" if reference_name else "reference ms"
        df[col] = [reference_ms.get(r) for r in df["run"]]
        df["reference speedup"] = [base / v if base and v else None for v in df[col]]
    return df


def _compared(result, baseline) -> tuple[Interval | None, str, tuple[str, str]]:
    speedup = generation_speedup if isinstance(result, GenerateResult) else speedup_over
    interval, why = speedup(baseline, result)
    reason = unreliable_reason(interval, baseline.load, result.load, result.label, baseline.label)
    return interval, why, reason


def finding(result: RunResult | GenerateResult, baseline: RunResult | GenerateResult) -> str:
    """What `result` measured against `baseline`, in the words its interval allows: '<result> is faster than
    <baseline>: 1.32× (1.21–1.44× at 95%, 3 rounds)', '... slower than ...', '... within noise of ...', or
    '<result> against <baseline>: unreliable (<why>), <figures>; <the numbers behind it>; ...' where the machine was
    busy, busier during one run than the other, or the interval is too wide to say (`unreliable_reason`); runs
    that cannot be compared say why."""
    interval, why, _ = _compared(result, baseline)
    text = judged_sentence(result.label, interval, baseline.label, baseline.load, result.load)
    return f"{text} ({why})" if why else text


def finding_verdict(result: RunResult | GenerateResult, baseline: RunResult | GenerateResult) -> str:
    """The one word `finding` rests on: 'faster', 'slower', 'within noise', 'unreliable' or 'not compared'."""
    interval, _, (short, _) = _compared(result, baseline)
    if interval is None:
        return "not compared"
    return "unreliable" if short else interval.verdict


class CodeBlock:
    """Source shown in a chapter: a Markdown code block in JupyterLab, and highlighted monospace HTML in a static
    export (where a Markdown output would be set in the page's proportional font).  `.data` is the Markdown."""

    def __init__(self, title: str, code: str):
        self.title, self.code = title, code.rstrip()
        self.data = f"{title}\n\n```python\n{self.code}\n```"

    def _repr_markdown_(self) -> str:
        return self.data

    def _repr_html_(self) -> str:
        from pygments import highlight
        from pygments.formatters import HtmlFormatter
        from pygments.lexers import PythonLexer

        title = re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(self.title))  # the title's Markdown, inline
        title = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", title)
        block = highlight(self.code, PythonLexer(), HtmlFormatter(noclasses=True, nowrap=False))
        return f"<p>{title}</p><div style='font-family: monospace; font-size: 12px'>{block}</div>"

    def __repr__(self) -> str:
        return self.data


def show_code(what) -> CodeBlock:
    """The code a toggle runs (by name), or any function's source, for a chapter: pulled from the package with
    `inspect`, so it cannot go stale."""
    if isinstance(what, str):
        if what not in TOGGLES:
            raise KeyError(f"no toggle {what!r}; toggles: {', '.join(TOGGLES)}")
        title = f"**`{what}`** runs (`scalekit/toggles/{what}.py`, shown by `scalekit toggles {what}`):"
        code = TOGGLES[what].code()
    else:
        title = f"**`{what.__module__}.{what.__qualname__}`**:"
        code = textwrap.dedent(inspect.getsource(what))
    return CodeBlock(title, code)
