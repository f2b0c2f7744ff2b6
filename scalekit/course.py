"""Small helpers the course notebooks share: pick sizes for the hardware, Before/After tables, and the sentence
that fits a measurement (so a chapter's prose never contradicts its table)."""

from __future__ import annotations

import inspect
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


def setup_plots() -> str:
    """Make plotly figures render in JupyterLab and in a static HTML export of the executed notebook.

    JupyterLab draws plotly's mimetype; `jupyter nbconvert --to html` cannot, so each figure also carries
    HTML, with plotly.js embedded once per notebook instead of fetched from a CDN (works offline).
    """
    import plotly.io as pio

    pio.renderers.default = PLOT_RENDERER
    return PLOT_RENDERER


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


def show_code(what):
    """The code a toggle runs (by name), or any function's source, as a Markdown code block for a chapter:
    pulled from the package with `inspect`, so it cannot go stale.  `.data` holds the Markdown text."""
    from IPython.display import Markdown

    if isinstance(what, str):
        if what not in TOGGLES:
            raise KeyError(f"no toggle {what!r}; toggles: {', '.join(TOGGLES)}")
        title = f"**`{what}`** runs (`scalekit/toggles/{what}.py`, shown by `scalekit toggles {what}`):"
        code = TOGGLES[what].code()
    else:
        title = f"**`{what.__module__}.{what.__qualname__}`**:"
        code = textwrap.dedent(inspect.getsource(what))
    return Markdown(f"{title}\n\n```python\n{code.rstrip()}\n```")
