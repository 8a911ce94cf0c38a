"""The visual report of ``amct-torch test`` (``PREFIX_test_report.html``, the result's
``_repr_html_``) and of ``evaluate --report-html``, on BVLC's LeNet train/test net with LMDB
test data: the page is parsed with html.parser; its accuracy figures are the ones ``caffe_test``
returned (and the text table printed), each drop is float minus the quantized form, and the
page fetches nothing."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from amct_torch.cli import main
from amct_torch.quality.html_report import TEST_SECTIONS
from amct_torch.quality.net_scores import FORMS, caffe_test, format_result
from helpers.html_page import parse
from helpers.train_nets import LENET_TRAIN_TEST, digits_lmdb, random_weights

pytest.importorskip("lmdb")


@pytest.fixture(scope="module")
def lenet(tmp_path_factory):
    """LeNet with random weights, 250 test digits, calibrated from its own TEST data."""
    d = tmp_path_factory.mktemp("lenet")
    (d / "lenet_train_test.prototxt").write_text(LENET_TRAIN_TEST)
    digits_lmdb(str(d / "examples/mnist/mnist_test_lmdb"), 250)
    model, weights = str(d / "lenet_train_test.prototxt"), str(d / "lenet.caffemodel")
    random_weights(model, weights, std=0.05)
    out = str(d / "out" / "lenet")
    assert main(["calibrate", model, weights, "--batch-num", "2", "-o", out, "-q", "--device", "cpu"]) == 0
    return model, weights, out


def _accuracy_rows(text: str) -> dict[str, list[str]]:
    """The accuracy section's rows, metric -> cells, header under ``"metric"``."""
    section = text[text.index('data-section="accuracy"'):]
    return {r[0]: r[1:] for r in parse(section).rows}


def test_test_writes_its_page_with_the_figures_it_returned(lenet, capsys):
    model, weights, out = lenet
    with open(out + "_report.html", "rb") as f:
        calibrate_page = f.read()
    capsys.readouterr()
    assert main(["test", model, weights, "--iterations", "2", "--quantized", out, "--json", "-q",
                 "--device", "cpu"]) == 0
    res = json.loads(capsys.readouterr().out)
    page = out + "_test_report.html"
    assert res["html_report"] == page
    text = open(page, encoding="utf-8").read()
    doc = parse(text)
    assert doc.sections == list(TEST_SECTIONS)
    assert doc.urls == [] and "http" not in text  # nothing fetched, nothing linked
    # the calibrate page is left as calibrate wrote it
    with open(out + "_report.html", "rb") as f:
        assert f.read() == calibrate_page
    forms = res["forms"]
    assert [f["form"] for f in forms] == ["float", "fake_quant", "deploy"]
    rows = _accuracy_rows(text)
    labels = [FORMS[f["form"]] for f in forms[1:]]
    assert rows["metric"] == ["float", *labels, *(f"drop ({lab})" for lab in labels)]
    for name, label in (("accuracy", "accuracy"), ("loss", "loss (* 1 loss)")):
        cells = rows[label]
        flt = forms[0]["outputs"][name]
        assert [float(c) for c in cells[:3]] == pytest.approx([f["outputs"][name] for f in forms], rel=1e-5)
        assert cells[:3] == [format(f["outputs"][name], ".6g") for f in forms]
        for f, cell in zip(forms[1:], cells[3:]):
            assert float(cell) == pytest.approx(flt - f["outputs"][name], rel=1e-5, abs=1e-7)
            assert float(cell) == pytest.approx(f["drop"][name], rel=1e-5, abs=1e-7)
    # the summary names the files scored and the iterations
    kv = {r[0]: r[1] for r in doc.rows if len(r) == 2}
    assert kv["model"] == model and kv["weights"] == weights
    assert kv["iterations"] == "2 of 100 image(s)"
    assert kv["quantized prefix"] == out and kv["calibrate report"] == out + "_report.html"
    scored = {r[0]: r for r in doc.rows if len(r) == 5}
    assert scored[FORMS["deploy"]][1] == f"{out}_deploy_model.prototxt, {out}_deploy_weights.caffemodel"
    assert scored[FORMS["float"]][2] == "200"


def test_repr_html_shows_the_table_test_prints(lenet):
    model, weights, out = lenet
    result = caffe_test(model, weights, iterations=1, quantized=out, device="cpu", quiet=True)
    doc = parse(result._repr_html_())
    assert doc.sections == list(TEST_SECTIONS)
    rows = _accuracy_rows(result._repr_html_())
    # the text table: output label, one column per form, then the drops
    text = format_result(result).splitlines()
    for label, line in (("accuracy", text[2]), ("loss (* 1 loss)", text[3])):
        assert line.startswith(label)
        assert rows[label] == line[len(label):].split()
    acc = result.forms[0].outputs["accuracy"]
    assert rows["accuracy"][0] == format(acc, ".6g") and 0.0 <= acc <= 1.0


def test_report_html_names_the_page_and_no_report_writes_none(lenet, tmp_path, capsys):
    model, weights, out = lenet
    page = str(tmp_path / "float_only.html")
    assert main(["test", model, weights, "--iterations", "1", "--report-html", page, "-q", "--device", "cpu"]) == 0
    assert f"report: {page}" not in capsys.readouterr().out  # -q: the table only
    rows = _accuracy_rows(open(page, encoding="utf-8").read())
    assert rows["metric"] == ["float"] and set(rows) == {"metric", "accuracy", "loss (* 1 loss)"}
    # --no-report: nothing beside calibrate's files
    before = sorted(os.listdir(os.path.dirname(out)))
    for name in before:
        if name.endswith("_test_report.html"):
            os.remove(os.path.join(os.path.dirname(out), name))
    before = sorted(os.listdir(os.path.dirname(out)))
    assert main(["test", model, weights, "--iterations", "1", "--quantized", out, "--no-report", "-q",
                 "--device", "cpu"]) == 0
    assert sorted(os.listdir(os.path.dirname(out))) == before
    # a page path that cannot be written is refused in one line before any forward
    capsys.readouterr()
    for bad in (str(tmp_path), str(tmp_path / "missing" / "p.html"), model):
        assert main(["test", model, weights, "--report-html", bad, "-q", "--device", "cpu"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and bad in err[0], err
    with pytest.raises(SystemExit) as stop:
        main(["test", model, weights, "--report-html", page, "--no-report"])
    assert stop.value.code == 2


def test_evaluate_report_html_holds_the_printed_table(tmp_path, capsys):
    from amct_torch.workflow.examples import example_data, example_model
    proto, weights = example_model()
    x, _ = example_data("calib")
    np.save(tmp_path / "x.npy", x[:16])
    page = str(tmp_path / "eval.html")
    assert main(["evaluate", proto, weights, str(tmp_path / "x.npy"), "--reference", proto, weights,
                 "--report-html", page, "-q", "--device", "cpu"]) == 0
    printed = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[1:] if line.strip()}
    text = open(page, encoding="utf-8").read()
    assert text.startswith("<!DOCTYPE html>") and "http" not in text
    doc = parse(text)
    assert doc.urls == []
    rows = [r for r in doc.rows if r[0] in printed]
    assert len(rows) == len(printed) >= 1
    for r in rows:
        assert r[2:5] == printed[r[0]][-3:]
