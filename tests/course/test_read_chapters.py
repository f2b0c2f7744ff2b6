"""tools/read_chapters.py: what it reports as page noise, on executed cells written here."""

from __future__ import annotations

import nbformat

from tests.helpers import load_tool


def executed(*outputs) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell("...")
    cell.outputs = [nbformat.from_dict(o) for o in outputs]
    return nbformat.v4.new_notebook(cells=[cell])


def html(text: str) -> dict:
    return {"output_type": "display_data", "metadata": {}, "data": {"text/html": text}}


def test_a_figures_embedded_script_is_not_page_noise_but_its_text_is():
    tool = load_tool("read_chapters")
    figure = '<div id="f"></div><script type="text/javascript">console.warn("PolyBool: Warning: Zero-length")</script>'
    assert tool.noise(executed(html(figure))) == []
    shown = tool.noise(executed(html(figure + "<pre>UserWarning: the page shows this</pre>")))
    assert len(shown) == 1 and shown[0].startswith("cell 0: a warning:")


def test_warnings_tracebacks_and_bare_return_values_are_reported():
    tool = load_tool("read_chapters")
    stream = {"output_type": "stream", "name": "stderr", "text": "x.py:3: FutureWarning: soon\n"}
    bare = {"output_type": "execute_result", "execution_count": 1, "metadata": {},
            "data": {"text/plain": "'plotly_mimetype+notebook'"}}
    found = tool.noise(executed(stream, bare))
    assert [f.split(": ")[1] for f in found] == ["a warning", "a bare return value"]
