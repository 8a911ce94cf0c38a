"""``amct-torch inspect MODEL [WEIGHTS]``: inputs and shapes, layer types with counts, the
quantized layers, every unsupported layer and the ONNX answer, as text or JSON; exit 0
(supported), 2 (a file cannot be read), 3 (something unsupported).

References: OpenCV's Caffe importer for the layer names and types (its own parser), a plain
regex reading of the prototxt written here for the input shapes and the AVE pooling layers,
and ONNX Runtime (via the preflight) for the ONNX answer."""
from __future__ import annotations

import json
import os
import re
from collections import Counter

import numpy as np
import pytest

from amct_torch.cli import main
from amct_torch.workflow.examples import example_model
from helpers.caffe_nets import make_net, rand
from helpers.data import nsfw_dir
from helpers.ssd import ssd_net

QUANTIZED_TYPES = {"Convolution", "InnerProduct", "Deconvolution"}


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["inspect", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def _layer_blocks(proto: str) -> list[tuple[str, str, str]]:
    """(name, type, block text) of each ``layer { ... }`` of a prototxt, by brace counting."""
    text, out, i = open(proto).read(), [], 0
    while True:
        m = re.compile(r"\blayer\s*\{").search(text, i)
        if not m:
            return out
        depth, j = 1, m.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        block = text[m.end():j - 1]
        name = re.search(r'\bname:\s*"([^"]+)"', block).group(1)
        typ = re.search(r'\btype:\s*"([^"]+)"', block).group(1)
        out.append((name, typ, block))
        i = j


def _expected_quantized(proto: str) -> list[str]:
    out = []
    for name, typ, block in _layer_blocks(proto):
        if typ in QUANTIZED_TYPES or (typ == "Pooling" and re.search(r"\bpool:\s*AVE", block)
                                      and not re.search(r"global_pooling:\s*true", block)):
            out.append(name)
    return sorted(out)


def _opencv_types(proto: str, model: str) -> Counter:
    import cv2
    net = cv2.dnn.readNetFromCaffe(proto, model)
    return Counter(net.getLayer(n).type for n in net.getLayerNames())


def _example() -> tuple[str, str]:
    return example_model()


def test_example_model_text(capsys):
    proto, weights = _example()
    rc, out, err = _run(capsys, proto, weights)
    assert rc == 0, err
    dims = re.findall(r"dim:\s*(\d+)", open(proto).read())
    assert f"data [{', '.join(dims)}]" in out
    section = " ".join(out.split("\nlayers", 1)[1].split("\nquantized")[0].split())  # wrapped lines
    types = dict(re.findall(r"(\w+) (\d+)", section.split(":", 1)[1]))
    cv = _opencv_types(proto, weights)
    assert {t: int(c) for t, c in types.items()} == {t: c for t, c in cv.items() if t != "Input"}
    quant_line = out.split("quantized", 1)[1].split("unsupported")[0]
    want = _expected_quantized(proto)
    assert f"{len(want)} of {len(want)} quantizable" in quant_line
    assert sorted(re.findall(r"[\w/.-]+", quant_line.split(":", 1)[1])) == want
    assert "unsupported  none" in out and "ONNX export  will work" in out and "ONNX Runtime" in out


def test_example_model_json_and_config(tmp_path, capsys):
    proto, weights = _example()
    want = _expected_quantized(proto)
    cfg = tmp_path / "quant.cfg"
    cfg.write_text(f'skip_layers: "{want[0]}"\n')
    rc, out, err = _run(capsys, proto, weights, "--config", str(cfg), "--json")
    assert rc == 0, err
    res = json.loads(out)
    assert res["supported"] is True and res["exit_code"] == 0 and res["onnx"]["ok"] is True
    assert res["quantizable"] == want and res["quantized"] == want[1:]
    assert res["inputs"][0]["name"] == "data" and res["layers"] == sum(res["layer_types"].values())
    assert str(cfg) in res["config"]


def test_nsfw_resnet50(capsys):
    """The real nsfw ResNet-50: 53 convolutions, the FC and the AVE pool quantized; the ONNX
    export will work (ONNX Runtime loads the preflight's float and QDQ models)."""
    d = nsfw_dir()
    proto, weights = os.path.join(d, "deploy.prototxt"), os.path.join(d, "resnet_50_1by2_nsfw.caffemodel")
    rc, out, err = _run(capsys, proto, weights, "--json")
    assert rc == 0, err
    res = json.loads(out)
    assert res["inputs"] == [{"name": "data", "shape": [1, 3, 224, 224]}]
    assert res["outputs"] == [{"name": "prob", "shape": [1, 2]}]
    assert res["layer_types"] == {t: c for t, c in _opencv_types(proto, weights).items() if t != "Input"}
    assert res["quantized"] == _expected_quantized(proto) and len(res["quantized"]) == 55
    assert res["onnx"]["ok"] is True and res["unsupported"] == []


def _net_with_unsupported(tmp_path) -> tuple[str, str]:
    body = ('layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1" convolution_param { num_output: 4 kernel_size: 3 } }\n'
            'layer { name: "mystery" type: "FancyNorm" bottom: "conv1" top: "mystery" }\n'
            'layer { name: "pylayer" type: "Python" bottom: "mystery" top: "pylayer" python_param { module: "my_layers" layer: "Gate" } }\n'
            'layer { name: "conv2" type: "Convolution" bottom: "pylayer" top: "conv2" convolution_param { num_output: 2 kernel_size: 1 } }\n'
            'layer { name: "odd" type: "Warp" bottom: "conv2" top: "odd" }\n')
    return make_net(tmp_path, body, {"data": [1, 3, 8, 8]},
                    {"conv1": [rand(4, 3, 3, 3, seed=1), rand(4, seed=2)], "conv2": [rand(2, 4, 1, 1, seed=3), rand(2, seed=4)]},
                    name="odd")


def test_unsupported_layers_are_all_listed(tmp_path, capsys):
    proto, model = _net_with_unsupported(tmp_path)
    rc, out, err = _run(capsys, proto, model)
    assert rc == 3, err
    for needle in ("layer 'mystery' (type FancyNorm): unknown layer type", "layer 'odd' (type Warp): unknown layer type",
                   "layer 'pylayer' (type Python)", "'my_layers'", "'Gate'", "3 layer(s)"):
        assert needle in out, (needle, out)
    assert "quantized    2 of 2" in out and "ONNX export  not checked" in out and "NOT supported (exit 3" in out
    rc, out, _ = _run(capsys, proto, model, "--json")
    res = json.loads(out)
    assert rc == 3 and res["exit_code"] == 3 and res["supported"] is False and res["onnx"]["ok"] is None
    assert [u["layer"] for u in res["unsupported"]] == ["mystery", "pylayer", "odd"]
    assert res["layer_types"] == {"Convolution": 2, "FancyNorm": 1, "Python": 1, "Warp": 1}


def test_without_weights_and_an_onnx_problem(tmp_path, capsys):
    """No WEIGHTS: the structure is checked with zero weights. A DetectionOutput with adaptive
    NMS has no ONNX form: exit 3, the message names the layer."""
    proto, _ = ssd_net(tmp_path, eta=0.9)
    rc, out, err = _run(capsys, proto)
    assert rc == 3, err
    assert "weights      none" in out and "ONNX export  will fail" in out and "detection_out" in out
    assert "unsupported  none" in out
    rc, out, _ = _run(capsys, proto, "--no-onnx")
    assert rc == 0 and "skipped" in out


@pytest.mark.parametrize("case", ["missing_model", "missing_weights", "garbage_prototxt", "missing_config"])
def test_unreadable_files_exit_2_with_one_line(tmp_path, capsys, case):
    proto, weights = _example()
    bad = str(tmp_path / "bad.prototxt")
    with open(bad, "w") as f:
        f.write("layer { name: \"x\" type: \n}")
    argv = {"missing_model": [str(tmp_path / "none.prototxt"), weights],
            "missing_weights": [proto, str(tmp_path / "none.caffemodel")],
            "garbage_prototxt": [bad],
            "missing_config": [proto, weights, "--config", str(tmp_path / "none.cfg")]}[case]
    rc, out, err = _run(capsys, *argv)
    lines = err.strip().splitlines()
    assert rc == 2 and out == "" and len(lines) == 1, err
    named = {"missing_model": "none.prototxt", "missing_weights": "none.caffemodel",
             "garbage_prototxt": "bad.prototxt", "missing_config": "none.cfg"}[case]
    assert lines[0].startswith("amct-torch inspect: error:") and named in lines[0]


def test_inspect_matches_what_calibrate_quantizes(tmp_path, capsys):
    """The layers inspect lists are the record's layers after a real calibration."""
    proto, weights = _example()
    rc, out, _ = _run(capsys, proto, weights, "--json", "--no-onnx")
    listed = json.loads(out)["quantized"]
    data = tmp_path / "d.npy"
    np.save(data, rand(4, 1, 16, 16, seed=3))
    prefix = str(tmp_path / "o" / "m")
    assert main(["calibrate", "-q", proto, weights, str(data), "-o", prefix, "--report-batches", "0"]) == 0
    capsys.readouterr()
    record = open(prefix + "_record.txt").read()
    assert sorted(re.findall(r'key:\s*"([^"]+)"', record)) == listed


def test_wrapped_lines_keep_their_indentation():
    from amct_torch.workflow.inspect_model import _wrap
    line = "unsupported  " + ", ".join(f"layer{i} (Python)" for i in range(20))
    lines = _wrap(line, width=60).splitlines()
    assert len(lines) > 2 and lines[0].startswith("unsupported  layer0")
    assert all(l.startswith(" " * 13) and not l.startswith(" " * 14) for l in lines[1:])
    assert " ".join(" ".join(lines).split()) == " ".join(line.split())
    nested = "    conv_x  " + " ".join(f"w{i}" for i in range(40))
    out = _wrap(nested, width=50).splitlines()
    assert out[0].startswith("    conv_x  w0") and all(l.startswith(" " * 12) for l in out[1:])
