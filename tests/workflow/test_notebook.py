"""The Jupyter quickstart runs top to bottom in a real kernel (nbclient; each cell within 120 s),
and shows what it promises: a histogram image, the per-layer table, the visual report inline
(with its accuracy section filled), ONNX Runtime results.
The notebook itself asserts that the record's conv2 factor is the IFMR result on the captured
activations and that ONNX Runtime agrees with the torch fake-quant model."""
from __future__ import annotations

import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOTEBOOK = os.path.join(ROOT, "notebooks", "quickstart.ipynb")


@pytest.mark.slow
def test_quickstart_runs(tmp_path, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("PYTHONPATH", ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("MPLCONFIGDIR", str(tmp_path))
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the kernel's temp folders (the notebook's outputs) go here
    nb = nbformat.read(NOTEBOOK, as_version=4)
    # a cell without an id is a warning now and a hard error in later nbformat versions (the
    # file as committed: nbformat.read fills missing ids in)
    with open(NOTEBOOK, encoding="utf-8") as f:
        assert all(c.get("id") for c in json.load(f)["cells"]), "every notebook cell needs an id"
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit the notebook without outputs"
    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), "no histogram image"
    pages = [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    assert any('data-section="layers"' in p and "top-1 accuracy %" in p and "<svg" in p for p in pages), \
        "no visual report with charts and accuracy"
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "clip range" in text and "SQNR dB" in text and "ONNX Runtime int8" in text
    # what the notebook wrote is under this test's folder, not the system temp folder
    assert [n for n in os.listdir(tmp_path) if n.startswith("amct_quickstart_")]
