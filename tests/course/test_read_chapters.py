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


def test_library_log_lines_are_page_noise():
    tool = load_tool("read_chapters")
    lines = [
        "Skipping import of cpp extensions due to incompatible torch version 2.13.0+cpu for torchao version 0.18.0",
        "Failed to load /usr/lib/python3/site-packages/torchao/_C.so: undefined symbol",
        "`loss_type=None` was set in the config but it is unrecognised.Using the default loss: `ForCausalLMLoss`.",
        "huggingface/tokenizers: The current process just got forked, after parallelism has already been used.",
        "WARNING:torchao.kernel:no cpp kernels",
    ]
    for line in lines:
        assert [f.split(":")[0] for f in tool.text_noise(line)] == ["library log lines"], line
    # what a page says of its own measurements is not noise, nor a word that merely ends in "so"
    assert tool.text_noise("bf16 is faster than fp32: 1.32× (1.21–1.44× at 95%), and so is sdpa; also") == []
    stream = {"output_type": "stream", "name": "stderr", "text": lines[0] + "\n"}
    assert [f.split(": ")[1] for f in tool.noise(executed(stream))] == ["library log lines"]


def test_the_page_it_writes_carries_no_widget_state(tmp_path, monkeypatch):
    import nbconvert
    import nbconvert.preprocessors

    tool = load_tool("read_chapters")
    seen = {}

    class Executed:  # what executing a notebook with a Lab does: its widgets' state lands in the metadata
        def __init__(self, **kwargs):
            seen["kwargs"] = kwargs

        def preprocess(self, nb, resources):
            if seen["kwargs"].get("store_widget_state", True):
                nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {"x": "30 MB"}}}
            return nb, resources

    class Exporter:
        def from_notebook_node(self, nb):
            seen["exported"] = dict(nb.metadata)
            return "<html></html>", {}

    monkeypatch.setattr(nbconvert.preprocessors, "ExecutePreprocessor", Executed)
    monkeypatch.setattr(nbconvert, "HTMLExporter", Exporter)
    path = tmp_path / "page.ipynb"
    nbformat.write(executed(), path)
    nb, html = tool.execute(path, tmp_path, 10)
    assert seen["kwargs"]["store_widget_state"] is False
    assert "widgets" not in seen["exported"] and "widgets" not in nb.metadata and html.exists()
    # and a notebook saved with widget state loses it on the way to the page
    dirty = executed()
    dirty.metadata["widgets"] = {"state": {}}
    assert "widgets" not in tool.without_widget_state(dirty).metadata
