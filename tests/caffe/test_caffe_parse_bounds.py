"""Parsing stays linear and bounded: files of many empty layers (tiny on disk, gigabytes once
parsed) are refused before parsing beyond the documented limits, and below them the time to
parse grows linearly with the count. Files are built here by code at small sizes."""
from __future__ import annotations

import time

import pytest

from amct_torch.caffe.graph import load_caffe
from amct_torch.caffe.limits import MAX_BLOBS, MAX_LAYERS
from amct_torch.caffe.netio import parse_caffemodel, parse_prototxt
from amct_torch.errors import ModelError
from amct_torch.proto import amct_caffe_pb2 as pb
from amct_torch.workflow.examples import EXAMPLE_DIR

EMPTY_LAYER = bytes([0xA2, 0x06, 0x00])  # NetParameter field 100 (layer), length 0
EMPTY_V1_LAYER = bytes([0x12, 0x00])  # NetParameter field 2 (V1 layers), length 0


def _write(path, data: bytes) -> str:
    with open(path, "wb") as f:
        f.write(data)
    return str(path)


@pytest.mark.parametrize("layer", [EMPTY_LAYER, EMPTY_V1_LAYER])
def test_caffemodel_over_the_layer_limit_is_refused_before_parsing(tmp_path, layer):
    p = _write(tmp_path / "many.caffemodel", layer * (MAX_LAYERS + 1))
    start = time.perf_counter()
    with pytest.raises(ModelError) as info:
        parse_caffemodel(p)
    assert time.perf_counter() - start < 2.0  # parsing 100k layers alone takes longer
    assert info.value.file == p and "100,000 layers" in str(info.value)


def test_caffemodel_at_the_limit_still_parses(tmp_path):
    p = _write(tmp_path / "edge.caffemodel", EMPTY_LAYER * MAX_LAYERS)
    assert len(parse_caffemodel(p).layer) == MAX_LAYERS


def test_caffemodel_over_the_blob_limit_is_refused(tmp_path):
    net = pb.NetParameter()  # encoded by protobuf itself: one layer of empty blobs
    layer = net.layer.add()
    for _ in range(MAX_BLOBS + 1):
        layer.blobs.add()
    p = _write(tmp_path / "blobs.caffemodel", net.SerializeToString())
    with pytest.raises(ModelError) as info:
        parse_caffemodel(p)
    assert info.value.file == p and "200,000 blobs" in str(info.value)


def test_a_broken_file_is_still_reported_by_the_parser(tmp_path):
    p = _write(tmp_path / "cut.caffemodel", EMPTY_LAYER * 3 + bytes([0xA2, 0x06, 0x40, 0x01]))
    with pytest.raises(ModelError, match="corrupt or truncated"):
        parse_caffemodel(p)


def test_prototxt_over_the_layer_limit_is_refused_before_parsing(tmp_path):
    p = _write(tmp_path / "many.prototxt", b"layer { name: 'a' type: 'ReLU' }\n" * (MAX_LAYERS + 1))
    start = time.perf_counter()
    with pytest.raises(ModelError) as info:
        parse_prototxt(p)
    assert time.perf_counter() - start < 2.0
    assert info.value.file == p and "100,000 layers" in str(info.value)


def _best_time(fn, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def test_caffemodel_parsing_is_linear_in_the_layer_count(tmp_path):
    small = _write(tmp_path / "s.caffemodel", EMPTY_LAYER * 10_000)
    big = _write(tmp_path / "b.caffemodel", EMPTY_LAYER * 80_000)
    ratio = _best_time(lambda: parse_caffemodel(big)) / _best_time(lambda: parse_caffemodel(small))
    assert ratio < 8 * 2.5, ratio  # 8x the layers: linear is 8, quadratic would be 64


def test_prototxt_parsing_is_linear_in_the_layer_count(tmp_path):
    def timed(count: int) -> float:
        best = float("inf")
        for k in range(2):  # distinct bytes each time: the reader keeps the last parse
            p = _write(tmp_path / f"{count}_{k}.prototxt",
                       f"# {k}\n".encode() + b"layer { name: 'a' type: 'ReLU' }\n" * count)
            start = time.perf_counter()
            parse_prototxt(p)
            best = min(best, time.perf_counter() - start)
        return best
    timed(500)  # warm-up
    ratio = timed(16_000) / timed(2_000)
    assert ratio < 8 * 2.5, ratio


def test_real_models_are_not_affected():
    gm = load_caffe(f"{EXAMPLE_DIR}/lenet_digits.prototxt", f"{EXAMPLE_DIR}/lenet_digits.caffemodel")
    assert len(list(gm.children())) == 19
