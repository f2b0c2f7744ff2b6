"""Small helpers the course notebooks share: pick sizes for the hardware, Before/After tables, and the sentence
that fits a measurement (so a chapter's prose never contradicts its table)."""

from __future__ import annotations

import html
import inspect
import re
import textwrap

from .hardware import cuda_gpu_present
from .inference.results import GenerateResult, generation_speedup
from .measure.results import RunResult, compare, speedup_over
from .measure.stats import sentence
from .toggles import TOGGLES


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


def before_after(results: list[RunResult], reference_ms: dict[str, float] | None = None, reference_name: str = ""):
    """compare(results), plus the public reference step time and speed-up beside each row where one exists."""
    df = compare(results)
    if reference_ms:
        base = reference_ms.get("baseline")
        col = f"reference ms ({reference_name})" if reference_name else "reference ms"
        df[col] = [reference_ms.get(r) for r in df["run"]]
        df["reference speedup"] = [base / v if base and v else None for v in df[col]]
    return df


def finding(result: RunResult | GenerateResult, baseline: RunResult | GenerateResult) -> str:
    """What `result` measured against `baseline`, in the words its interval allows: '<result> is faster than
    <baseline>: 1.32× (1.21–1.44× at 95%, 3 rounds)', '... slower than ...', or '... within noise of ...'
    (scalekit.measure.stats.sentence); runs that cannot be compared say why."""
    speedup = generation_speedup if isinstance(result, GenerateResult) else speedup_over
    interval, why = speedup(baseline, result)
    text = sentence(result.label, interval, baseline.label)
    return f"{text} ({why})" if why else text


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
