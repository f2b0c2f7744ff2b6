"""Read a chapter as a student would: execute it to static HTML, then screenshot each section in Chromium.

    python tools/read_chapters.py notebooks/09_finetuning.ipynb --out /tmp/read
    python tools/read_chapters.py --out /tmp/read                  # every chapter

Writes `<out>/<chapter>.html` and `<out>/<chapter>/NN_<section>.png`, one picture per `##` section (the part of the
page from its heading to the next), and prints what a reader should not meet on the page: outputs that are a
bare return value (`'plotly_mimetype+notebook'`, `<Figure ...>`), warnings, tracebacks, tables cut with "…", and libraries' own log lines (torchao's
skipped .so kernels, transformers' loss_type line, ...).  The page it writes carries no widget state.
Needs Chromium (`/usr/bin/chromium`) and Playwright, both part of the test set-up.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
WIDGET = "application/vnd.jupyter.widget-view+json"
SCRIPT = re.compile(r"<script\b.*?</script>", re.S | re.I)
# what libraries print about themselves as they load or build a model, not what the page measured: torchao's
# compiled kernels it skips, any library's missing .so, transformers' loss_type line, bitsandbytes' build, tokenizers
# after a fork, generate's pad token, and a library's logger writing to the page
LIBRARY_NOISE = re.compile(
    r"Skipping import of cpp extensions|TORCHAO_FORCE_SKIP_LOADING_SO_FILES|"
    r"(?:load|loading|find|import|open)\w* [^\n]{0,80}\.so\b|"
    r"\.so\b[^\n]{0,80}(?:not found|cannot|failed|incompatible|undefined symbol)|cannot open shared object file|"
    r"was set in the config but it is unrecognis|"
    r"The installed version of bitsandbytes|bitsandbytes was compiled without|"
    r"huggingface/tokenizers: The current process just got forked|"
    r"Setting `pad_token_id` to `eos_token_id`|"
    r"^(?:WARNING|INFO|ERROR):(?:root|torch|torchao|transformers|bitsandbytes|accelerate|peft)[.:]",
    re.M | re.I)
NOISE = [
    (re.compile(r"Warning:|warnings\.warn|UserWarning|FutureWarning|DeprecationWarning"), "a warning"),
    (re.compile(r"Traceback \(most recent call last\)"), "a traceback"),
    (re.compile(r"^'[^'\n]*'$", re.M), "a bare return value"),
    (re.compile(r"<[A-Za-z_.]+ (object )?at 0x[0-9a-f]+>"), "an object repr"),
    (re.compile(r" \.\.\.  |\.\.\.</td>|<td>\.\.\.|\[\d+ rows x \d+ columns\]|\d+ rows × \d+ columns"),
     "a table cut short"),
    (re.compile(r"USDT|\[W[0-9]{3,}|STAGE:"), "profiler or C++ log lines"),
    (LIBRARY_NOISE, "library log lines"),
]


def execute(path: Path, out: Path, timeout_s: int):
    """The executed notebook, and its static HTML written to `<out>/<chapter>.html` (as nbconvert makes it)."""
    import nbformat
    from nbconvert import HTMLExporter
    from nbconvert.preprocessors import ExecutePreprocessor

    nb = nbformat.read(path, as_version=4)
    # no widget state: a Lab's plots hold tens of MB of points (99's page was 36 MB, 30.8 of them widget state); the
    # static page shows the Lab's snapshot instead
    ExecutePreprocessor(timeout=timeout_s, store_widget_state=False).preprocess(
        nb, {"metadata": {"path": str(path.parent)}})
    html = out / f"{path.stem}.html"
    html.write_text(HTMLExporter().from_notebook_node(without_widget_state(nb))[0], encoding="utf-8")
    return nb, html


def without_widget_state(nb):
    """`nb` with no widget state in its metadata (what an executed notebook saved by Jupyter carries); the views
    in the outputs stay, and show as their plain-text fallback where the state is gone."""
    nb.get("metadata", {}).pop("widgets", None)
    return nb


def noise(nb) -> list[str]:
    """What the executed notebook shows that a reader should not meet, per cell."""
    found = []
    for i, cell in enumerate(nb.cells):
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if WIDGET in data:  # a live widget: its plain-text fallback is not what a reader sees
                continue
            if "font-family: monospace" in "".join(data.get("text/html", "")):  # source shown by show_code
                continue
            # what a static page shows: the HTML where there is some (a table cut by pandas shows there)
            text = output.get("text") or "".join(data.get("text/html", "")) or "".join(data.get("text/plain", ""))
            found += [f"cell {i}: {line}" for line in text_noise(text)]
    return found


def text_noise(text: str) -> list[str]:
    """What a reader should not meet in one output's text (or HTML), one line per kind found: 'a warning: ...'."""
    text = SCRIPT.sub("", text)  # a figure's embedded plotly.js is code the page runs, not text it shows
    found = []
    for pattern, what in NOISE:
        match = pattern.search(text)
        if match:
            found.append(f"{what}: {text[max(0, match.start() - 60):match.end() + 60]!r}")
    return found


def screenshots(html: Path, out: Path) -> list[Path]:
    from playwright.sync_api import sync_playwright

    folder = out / html.stem
    folder.mkdir(parents=True, exist_ok=True)
    shots = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(html.as_uri())
        page.wait_for_timeout(1500)  # plotly draws after load
        heads = page.locator("h1, h2").all()
        tops = [h.bounding_box()["y"] for h in heads] + [page.evaluate("document.body.scrollHeight")]
        for n, (head, top, bottom) in enumerate(zip(heads, tops, tops[1:], strict=False)):
            name = re.sub(r"[^a-z0-9]+", "_", head.inner_text().lower()).strip("_")[:40] or "section"
            shot = folder / f"{n:02d}_{name}.png"
            page.screenshot(path=str(shot), full_page=True,
                            clip={"x": 0, "y": top, "width": 1280, "height": max(1, min(bottom - top, 6000))})
            shots.append(shot)
        browser.close()
    return shots


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="*", type=Path, help="chapters (default: every notebooks/*.ipynb)")
    parser.add_argument("--out", type=Path, required=True, help="folder for the HTML and the screenshots")
    parser.add_argument("--timeout-s", type=int, default=600, help="per cell")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    bad = 0
    for path in [p.resolve() for p in args.paths] or sorted((ROOT / "notebooks").glob("*.ipynb")):
        nb, html = execute(path, args.out, args.timeout_s)
        shots = screenshots(html, args.out)
        print(f"{path.name}: {html} and {len(shots)} section pictures in {args.out / html.stem}")
        found = noise(nb)
        for line in found:
            print("   ", line)
        bad += len(found)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
