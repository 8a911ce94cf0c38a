"""Hostile and broken inputs, hand-written per class of defect, and a runner that feeds them to
the real CLI (and the API) in a child process under a memory limit.

Each case writes its files into its own folder and gives the ``amct-torch`` command line that
uses them plus the user's file the one-line error must name. ``run_cases`` runs a list of
cases in ONE child process (``resource.setrlimit(RLIMIT_AS)`` first, so a case that asks for
gigabytes gets a MemoryError instead of taking the machine), calling ``amct_torch.cli.main``
for each with stderr captured, and reports per case: exit code, stderr, whether a traceback
escaped, the files left in the case's output folder, and the peak RSS so far.
"""
from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
import zipfile
import zlib
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

import numpy as np

from amct_torch.workflow.examples import EXAMPLE_DIR

MODEL = os.path.join(EXAMPLE_DIR, "lenet_digits.prototxt")
WEIGHTS = os.path.join(EXAMPLE_DIR, "lenet_digits.caffemodel")
DATA = os.path.join(EXAMPLE_DIR, "digits_calib.npz")
MEMORY_LIMIT_MB = 2500


@dataclass
class Case:
    """One hostile input: ``argv`` of ``amct-torch`` (``{out}`` = the case's output prefix),
    ``names``: the user's file the message must name."""
    name: str
    kind: str
    argv: list
    names: str
    out: str = ""
    #: a file that may be named instead (a prototxt/caffemodel disagreement involves both)
    or_names: str = ""
    #: the run must succeed (bounded work on a hostile-looking but valid input)
    expect_ok: bool = False
    #: files (path relative to the output folder → text) made before the run: an earlier
    #: run's outputs, a dead run's staging folder
    setup: dict = field(default_factory=dict)
    #: the exact file names the output folder must hold after a successful run
    expect_left: Optional[list] = None


def _text(path: str, text: str) -> str:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def _bytes(path: str, data: bytes) -> str:
    with open(path, "wb") as f:
        f.write(data)
    return path


def model_text() -> str:
    with open(MODEL, encoding="utf-8") as f:
        return f.read()


def weights_bytes() -> bytes:
    with open(WEIGHTS, "rb") as f:
        return f.read()


def _calibrate(model: str = MODEL, weights: str = WEIGHTS, data: str = DATA, *extra) -> list:
    return ["calibrate", model, weights, data, "--device", "cpu", "-q", "--batch-num", "1",
            "--report-batches", "0", "-o", "{out}"] + list(extra)


def _convert(record: str, model: str = MODEL, weights: str = WEIGHTS) -> list:
    return ["convert", model, weights, record, "-q", "-o", "{out}"]


def _config(model: str = MODEL, weights: str = WEIGHTS, *extra) -> list:
    return ["config", model, weights, "-q", "-o", "{out}.json"] + list(extra)


# ---------------------------------------------------------------- prototxt
def prototxt_texts() -> dict[str, str]:
    """name → hostile prototxt text."""
    good = model_text()
    shape = "shape {\n      dim: 1\n      dim: 1\n      dim: 16\n      dim: 16\n    }"
    out = {
        "empty": "",
        "only_comment": "# nothing here\n",
        "garbage": "}}}{{{ ::: \x01",
        "unterminated_string": 'name: "abc\n',
        "quote_backslashes_80k": "name: '" + "\\'" * 40000 + "\n",
        "deep_nesting_3000": "layer " + "{ convolution_param " * 3000 + "}" * 3001 + "\n",
        "deep_nesting_100k": "a {" * 100000 + "\n",
        "dims_2pow32": good.replace(shape, "shape { dim: 1 dim: 1 dim: 4294967296 dim: 4294967296 }"),
        "dims_negative": good.replace(shape, "shape { dim: 1 dim: 1 dim: -16 dim: 16 }"),
        "dims_zero": good.replace(shape, "shape { dim: 1 dim: 0 dim: 16 dim: 16 }"),
        "dims_huge_int": good.replace(shape, "shape { dim: 1 dim: 1 dim: " + "9" * 5000 + " dim: 16 }"),
        "dims_100000": good.replace(shape, "shape { dim: 1 dim: 1 dim: 100000 dim: 100000 }"),
        "unknown_type": good.replace('type: "ReLU"', 'type: "NoSuchLayer"', 1),
        "missing_bottom": good.replace('bottom: "conv1"\n  top: "conv1"\n  batch_norm_param',
                                       'bottom: "nowhere"\n  top: "conv1"\n  batch_norm_param', 1),
        "kernel_huge": good.replace("kernel_size: 3", "kernel_size: 4000000000", 1),
        "kernel_zero": good.replace("kernel_size: 3", "kernel_size: 0", 1),
        "num_output_zero": good.replace("num_output: 16", "num_output: 0", 1),
        "num_output_wrong": good.replace("num_output: 16", "num_output: 17", 1),
        "pad_negative": good.replace("pad: 1", "pad: -5", 1),
        "stride_zero": good.replace("stride: 1", "stride: 0", 1),
        "not_utf8": "name: \"\xff\xfe\"",
        "nul_bytes": good.replace("conv1", "conv\x001", 1),
        "float_in_int": good.replace("num_output: 16", "num_output: 1e9", 1),
        "nan_eps": good.replace("eps: 1e-05", "eps: nan", 1),
        "duplicate_layer": good + good[good.index("layer {\n  name: \"conv1\""):],
        "input_dim_legacy_huge": 'input: "data"\ninput_dim: 1\ninput_dim: 1\ninput_dim: 2147483647\ninput_dim: 2147483647\n'
                                 + good[good.index("layer {\n  name: \"conv1\""):],
        "long_line_error": "name: " + "x" * 200000 + "\n",
        "many_layers_text": "layer { name: 'a' type: 'ReLU' }\n" * 20000,
    }
    return out


#: prototxt cases where the prototxt and the caffemodel disagree: either may be named
_DISAGREE = ("dims_100000", "kernel_huge", "num_output_wrong", "dims_zero", "dims_negative",
             "nul_bytes")


def prototxt_cases(folder: str) -> list[Case]:
    cases = []
    for name, text in prototxt_texts().items():
        raw = text.encode("latin-1") if name == "not_utf8" else text.encode("utf-8")
        p = _bytes(os.path.join(folder, f"{name}.prototxt"), raw)
        argv = _config(p) if name in ("deep_nesting_100k", "many_layers_text") else _calibrate(p)
        cases.append(Case(f"prototxt/{name}", "prototxt", argv, p,
                          or_names=WEIGHTS if name in _DISAGREE else ""))
    return cases


# ---------------------------------------------------------------- caffemodel
def caffemodel_blobs() -> dict[str, bytes]:
    from amct_torch.proto import amct_caffe_pb2 as pb
    raw = weights_bytes()
    net = pb.NetParameter()
    net.ParseFromString(raw)
    out = {"empty": b"", "garbage": b"\x8a\x01" * 100 + b"\xff" * 50,
           "text_instead": model_text().encode(), "truncated_half": raw[:len(raw) // 2],
           "truncated_1": raw[:-1], "truncated_header": raw[:7]}

    def variant(edit: Callable) -> bytes:
        n = pb.NetParameter()
        n.CopyFrom(net)
        edit(n)
        return n.SerializeToString()

    layers = net.layer if len(net.layer) else net.layers
    conv = next(i for i, l in enumerate(layers) if l.name == "conv1")

    def set_dims(dims):
        def edit(n):
            b = (n.layer if len(n.layer) else n.layers)[conv].blobs[0]
            b.shape.ClearField("dim")
            b.shape.dim.extend(dims)
        return edit

    def set_data(values):
        def edit(n):
            b = (n.layer if len(n.layer) else n.layers)[conv].blobs[0]
            vals = list(b.data)
            vals[:len(values)] = values
            b.ClearField("data")
            b.data.extend(vals)
        return edit

    out["blob_dims_2pow32"] = variant(set_dims([2 ** 32, 2 ** 32]))
    out["blob_dims_negative"] = variant(set_dims([-16, 1, 3, 3]))
    out["blob_dims_wrong"] = variant(set_dims([16, 1, 3, 4]))
    out["blob_dims_2pow62"] = variant(set_dims([2 ** 62, 4]))
    out["weights_nan"] = variant(set_data([float("nan")]))
    out["weights_inf"] = variant(set_data([float("inf")] * 3))
    out["weights_3e38"] = variant(set_data([3e38] * 9))

    def fc2_huge(n):  # finite but far too large: scale_w would leave the plausible range
        b = next(l for l in (n.layer if len(n.layer) else n.layers) if l.name == "fc2").blobs[0]
        vals = [1e25 * v for v in b.data]
        b.ClearField("data")
        b.data.extend(vals)
    out["fc2_weights_1e25"] = variant(fc2_huge)

    def drop_data(n):
        (n.layer if len(n.layer) else n.layers)[conv].blobs[0].ClearField("data")
    out["blob_no_data"] = variant(drop_data)

    def drop_layer(n):
        del (n.layer if len(n.layer) else n.layers)[conv]
    out["layer_missing"] = variant(drop_layer)
    # cut exactly between two top-level fields: valid protobuf, a smaller net
    cut = variant(lambda n: None)
    n2 = pb.NetParameter()
    n2.CopyFrom(net)
    keep = pb.NetParameter()
    keep.name = n2.name
    for l in list(n2.layer)[:2]:
        keep.layer.add().CopyFrom(l)
    out["cut_between_layers"] = keep.SerializeToString() if len(net.layer) else cut[:len(cut) // 3]
    return out


def caffemodel_cases(folder: str) -> list[Case]:
    cases = []
    for name, raw in caffemodel_blobs().items():
        p = _bytes(os.path.join(folder, f"{name}.caffemodel"), raw)
        cases.append(Case(f"caffemodel/{name}", "caffemodel", _calibrate(weights=p), p,
                          or_names=""))
    return cases


# ---------------------------------------------------------------- quant.cfg
def quant_cfg_texts() -> dict[str, str]:
    ifmr = ("common_config { arq_quantize { channel_wise: true } ifmr_quantize { "
            "search_range_start: 0.7 search_range_end: {end} search_step: {step} "
            "max_percentile: 0.999999 min_percentile: 0.999999 asymmetric: true } }\n")
    return {
        "empty_ok_but_garbage": "}{",
        "search_step_1e-9": ifmr.replace("{end}", "1.3").replace("{step}", "1e-9"),
        "search_step_1e-30": ifmr.replace("{end}", "1.3").replace("{step}", "1e-30"),
        "search_range_end_1e30": ifmr.replace("{end}", "1e30").replace("{step}", "0.01"),
        "search_range_end_inf": ifmr.replace("{end}", "inf").replace("{step}", "0.01"),
        "search_range_end_nan": ifmr.replace("{end}", "nan").replace("{step}", "0.01"),
        "search_range_end_1e6": ifmr.replace("{end}", "1e6").replace("{step}", "0.01"),
        "percentile_0": "common_config { ifmr_quantize { max_percentile: 0 } }\n",
        "num_of_bins_3": "common_config { hfmg_quantize { num_of_bins: 3 } }\n",
        "batch_num_zero": "batch_num: 0\n",
        "batch_num_huge": "batch_num: 99999999999999999999999\n",
        "skip_unknown": 'skip_layers: "nope"\n',
        "skip_all": 'skip_layers: "conv1" skip_layers: "conv2" skip_layers: "conv3" skip_layers: "fc1" '
                    'skip_layers: "fc2" skip_layers: "pool2"\n',
        "deep_nesting": "common_config " + "{ " * 5000 + "}" * 5000 + "\n",
        "quote_backslashes_80k": "skip_layers: '" + "\\'" * 40000 + "\n",
        "unknown_field": "no_such_field: 1\n",
        "long_token": "skip_layers: " + "y" * 100000 + "\n",
        "channel_wise_fc": 'override_layer_configs { layer_name: "fc1" calibration_config { '
                           'arq_quantize { channel_wise: true } } }\n',
        "nul_bytes": "batch_num: 1\x00\n",
    }


def quant_cfg_cases(folder: str) -> list[Case]:
    cases = []
    for name, text in quant_cfg_texts().items():
        p = _text(os.path.join(folder, f"{name}.cfg"), text)
        cases.append(Case(f"quant_cfg/{name}", "quant_cfg", _calibrate(MODEL, WEIGHTS, DATA, "-c", p), p))
        if name in ("search_step_1e-9", "search_range_end_1e30", "deep_nesting"):
            cases.append(Case(f"quant_cfg/{name}/config", "quant_cfg",
                              _config(MODEL, WEIGHTS, "--quant-cfg", p), p))
    return cases


# ---------------------------------------------------------------- JSON config
def json_texts() -> dict[str, str]:
    import tempfile

    from amct_torch.config import create_quant_config
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "c.json")
        create_quant_config(p, MODEL, WEIGHTS)
        good = open(p, encoding="utf-8").read()
    return {
        "not_json": "{ nope",
        "empty": "",
        "number_401_digits": good.replace('"batch_num": 1', '"batch_num": 1' + "0" * 400 + ".5", 1),
        "float_1e400": good.replace('"search_step": 0.01', '"search_step": 1e400', 1),
        "int_5000_digits": good.replace('"batch_num": 1', '"batch_num": 1' + "0" * 5000, 1),
        "deep_array": good.replace('"skip_fusion_layers": []', '"skip_fusion_layers": ' + "[" * 100000 + "]" * 100000, 1),
        "duplicate_key": good.replace('"batch_num": 1,', '"batch_num": 1, "batch_num": 2,', 1),
        "nan": good.replace('"search_step": 0.01', '"search_step": NaN', 1),
        "search_step_tiny": good.replace('"search_step": 0.01', '"search_step": 1e-9', 1),
        "search_range_huge": good.replace('[\n                0.7,\n                1.3\n            ]', '[0.7, 1e30]', 1),
        "unknown_layer": good.replace('"conv1"', '"nosuch"', 1),
        "wrong_type": good.replace('"batch_num": 1', '"batch_num": "one"', 1),
        "batch_num_1e12": good.replace('"batch_num": 1', '"batch_num": 1000000000000', 1),
        "array_root": "[1, 2, 3]",
        "utf16": "\ufeff" + good,
    }


def json_cases(folder: str) -> list[Case]:
    cases = []
    for name, text in json_texts().items():
        p = os.path.join(folder, f"{name}.json")
        if name == "utf16":
            _bytes(p, text.encode("utf-16"))
        else:
            _text(p, text)
        argv = _calibrate(MODEL, WEIGHTS, DATA, "-c", p)
        if name == "batch_num_1e12":  # the config's batch_num, more batches than the data has
            argv.remove("--batch-num")
            argv.remove("1")
            cases.append(Case(f"json/{name}", "json", argv, DATA))
            continue
        cases.append(Case(f"json/{name}", "json", argv, p))
    return cases


# ---------------------------------------------------------------- record
def record_texts() -> dict[str, str]:
    def entry(name, scale_d="0.01", offset_d="-128", sw="scale_w: 0.01", ow="offset_w: 0", extra=""):
        return (f'record {{\n  key: "{name}"\n  value {{\n    scale_d: {scale_d}\n    offset_d: {offset_d}\n'
                f"    {sw}\n    {ow}\n{extra}  }}\n}}\n")
    layers = ("conv1", "conv2", "conv3", "fc1", "fc2")
    base = "".join(entry(n) for n in layers) + entry("pool2", sw="scale_w: 1", ow="offset_w: 0")

    def with_conv1(**kw):
        return entry("conv1", **kw) + "".join(entry(n) for n in layers[1:]) + entry("pool2", sw="scale_w: 1")
    return {
        "empty": "",
        "garbage": "record { key: ",
        "scale_d_3e38": with_conv1(scale_d="3e38"),
        "scale_d_1e-45": with_conv1(scale_d="1e-45"),
        "scale_d_1e-30": with_conv1(scale_d="1e-30"),
        "scale_d_nan": with_conv1(scale_d="nan"),
        "scale_d_negative": with_conv1(scale_d="-1"),
        "scale_w_1e6_zeroes_every_weight": with_conv1(sw="scale_w: 1e6"),
        "scale_w_3e38": with_conv1(sw="scale_w: 3e38"),
        "scale_w_1e-44": with_conv1(sw="scale_w: 1e-44"),
        "offset_d_1000": with_conv1(offset_d="1000"),
        "offset_d_huge": with_conv1(offset_d="9" * 5000),
        "unknown_layer": base + entry("nosuch"),
        "duplicate": base + entry("conv1"),
        "quote_backslashes_80k": "record { key: '" + "\\'" * 40000 + "\n",
        "deep_nesting": "record { value " + "{ " * 5000 + "}" * 5001 + "\n",
        "shift_bit": with_conv1(extra="    shift_bit: 3\n"),
        "long_token": "record { key: " + "z" * 100000 + " }\n",
        "scale_w_count": with_conv1(sw="scale_w: 0.1 scale_w: 0.2"),
    }


def record_cases(folder: str) -> list[Case]:
    cases = []
    for name, text in record_texts().items():
        p = _text(os.path.join(folder, f"{name}.txt"), text)
        cases.append(Case(f"record/{name}", "record", _convert(p), p))
    return cases


# ---------------------------------------------------------------- data
def _png(width: int, height: int, rows: Optional[bytes] = None, all_rows: bool = False) -> bytes:
    """A grayscale PNG (compressed rows of zeros when ``rows`` is None: tiny file, huge image;
    only the first 4000 rows unless ``all_rows``)."""
    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)
    if rows is None:
        comp = zlib.compressobj(9)
        line = b"\x00" * (width + 1)
        n = height if all_rows else min(height, 4000)
        data = b"".join(comp.compress(line) for _ in range(n)) + comp.flush()
    else:
        data = zlib.compress(rows)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", data) + chunk(b"IEND", b""))


def _npy_header_only(shape, dtype="<f4") -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": dtype, "fortran_order": False, "shape": shape})
    return buf.getvalue()


def data_cases(folder: str) -> list[Case]:
    cases = []

    def add(name, path, argv=None, names=None):
        cases.append(Case(f"data/{name}", "data", argv or _calibrate(data=path), names or path))

    d = os.path.join(folder, "data")
    os.makedirs(d, exist_ok=True)
    p = os.path.join(d, "strings.npy")
    np.save(p, np.array(["a", "b"] * 64))
    add("npy_strings", p)
    p = os.path.join(d, "objects.npy")
    np.save(p, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    add("npy_pickle", p)
    add("npy_truncated", _bytes(os.path.join(d, "trunc.npy"), _npy_header_only((100, 1, 16, 16)) + b"\0" * 100))
    add("npy_header_1e12", _bytes(os.path.join(d, "huge.npy"), _npy_header_only((10 ** 6, 1, 1000, 1000)) + b"\0" * 64))
    add("npy_garbage", _bytes(os.path.join(d, "garbage.npy"), b"\x93NUMPY garbage"))
    p = os.path.join(d, "wrongshape.npy")
    np.save(p, np.zeros((4, 3, 16, 16), np.float32))
    add("npy_wrong_channels", p)
    p = os.path.join(d, "rank2.npy")
    np.save(p, np.zeros((4, 16), np.float32))
    add("npy_rank2", p)
    p = os.path.join(d, "nan.npy")
    np.save(p, np.full((8, 1, 16, 16), np.nan, np.float32))
    add("npy_nan", p)
    p = os.path.join(d, "inf.npy")
    np.save(p, np.full((8, 1, 16, 16), np.inf, np.float32))
    add("npy_inf", p)
    p = os.path.join(d, "complex.npy")
    np.save(p, np.zeros((8, 1, 16, 16), np.complex64))
    add("npy_complex", p)
    p = os.path.join(d, "empty.npy")
    np.save(p, np.zeros((0, 1, 16, 16), np.float32))
    add("npy_empty", p)
    p = os.path.join(d, "big_hw.npy")  # 2 MB of data declaring 1×1×1000×500
    np.save(p, np.zeros((1, 1, 1000, 500), np.float32))
    p = bomb_npz(os.path.join(d, "bomb.npz"), 2 ** 20)  # 1 MB .npz, 1 GiB of float32 zeros
    cases.append(Case("data/npz_bomb_1gb_default_batch", "data", _calibrate(MODEL, WEIGHTS, p), p,
                      expect_ok=True))
    add("npz_empty", _bytes(os.path.join(d, "empty.npz"), zipfile_bytes({})))
    add("npz_garbage", _bytes(os.path.join(d, "garbage.npz"), b"PK\x03\x04garbage"))
    add("npz_strings", _bytes(os.path.join(d, "strings.npz"), zipfile_bytes({"inputs.npy": npy_bytes(np.array(["x"] * 10))})))
    # image folders
    for name, blob in (("png_100000", _png(100000, 100000)), ("png_corrupt", b"\x89PNG\r\n\x1a\n" + b"\0" * 50),
                       ("jpg_text", b"not a jpeg"), ("png_zero_height", _png(16, 0, b""))):
        folder_i = os.path.join(d, name)
        os.makedirs(folder_i, exist_ok=True)
        ext = ".jpg" if name.startswith("jpg") else ".png"
        p = _bytes(os.path.join(folder_i, "img" + ext), blob)
        add(f"images/{name}", p, _calibrate(MODEL, WEIGHTS, folder_i), p)
    folder_i = os.path.join(d, "mixed")
    os.makedirs(folder_i, exist_ok=True)
    _bytes(os.path.join(folder_i, "a.png"), _png(16, 16, b"\0" * (17 * 16)))
    p = _text(os.path.join(folder_i, "notes.txt"), "hello")
    add("images/non_image_file", p, _calibrate(MODEL, WEIGHTS, folder_i), p)
    folder_i = os.path.join(d, "emptydir")
    os.makedirs(folder_i, exist_ok=True)
    add("images/empty_folder", folder_i, _calibrate(MODEL, WEIGHTS, folder_i), folder_i)
    # a net declaring a 100000x100000 input fed with one small image
    big = os.path.join(d, "big_input.prototxt")  # conv1 + BN + ReLU only: any input size fits
    text = model_text()
    text = text[:text.index("layer {", text.index('name: "relu1"') - 20)]
    _text(big, text.replace("dim: 16\n      dim: 16", "dim: 100000\n      dim: 100000", 1))
    folder_i = os.path.join(d, "one_image")
    os.makedirs(folder_i, exist_ok=True)
    _bytes(os.path.join(folder_i, "a.png"), _png(16, 16, b"\0" * (17 * 16)))
    add("images/declared_100000_input", big, _calibrate(big, WEIGHTS, folder_i))
    add("missing", os.path.join(d, "nope.npy"))
    return cases


def bomb_npz(path: str, samples: int) -> str:
    """A small .npz whose ``inputs`` member decompresses to ``samples`` 1×16×16 float32 zeros."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z, z.open("inputs.npy", "w", force_zip64=True) as f:
        f.write(_npy_header_only((samples, 1, 16, 16)))
        chunk = b"\0" * (1 << 22)
        left = samples * 1024
        while left > 0:
            f.write(chunk[:left])
            left -= len(chunk)
    return path


def npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def zipfile_bytes(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for k, v in members.items():
            z.writestr(k, v)
    return buf.getvalue()


# ---------------------------------------------------------------- outputs
def output_cases(folder: str) -> list[Case]:
    import shutil
    d = os.path.join(folder, "outputs")
    os.makedirs(d, exist_ok=True)
    m = shutil.copy(MODEL, os.path.join(d, "m.prototxt"))
    w = shutil.copy(WEIGHTS, os.path.join(d, "w.caffemodel"))
    os.makedirs(os.path.join(d, "dir_record.txt"), exist_ok=True)
    blocker = _text(os.path.join(d, "afile"), "x")
    cases = [
        Case("outputs/config_over_model", "outputs", ["config", m, w, "-q", "-o", m], m),
        Case("outputs/config_over_weights", "outputs", ["config", m, w, "-q", "-o", w], w),
        Case("outputs/calibrate_prefix_is_dir", "outputs", ["calibrate", m, w, DATA, "-q", "--device", "cpu",
                                                             "-o", os.path.join(d, "dir")],
             os.path.join(d, "dir_record.txt")),
        Case("outputs/folder_is_a_file", "outputs", ["config", m, w, "-q", "-o", os.path.join(blocker, "c.json")],
             blocker),
        Case("outputs/config_output_is_folder", "outputs", ["config", m, w, "-q", "-o", d], d),
    ]
    return cases


class _Pickled:
    """Any pickled object: a checkpoint must never unpickle it."""


def checkpoint_cases(folder: str) -> list[Case]:
    """--checkpoint files that do not belong to the run or are not checkpoints at all."""
    import torch

    import amct_torch
    from amct_torch.calibration.checkpoint import save_checkpoint
    cases = []

    def add(name, path):
        cases.append(Case(f"checkpoint/{name}", "checkpoint",
                          _calibrate(MODEL, WEIGHTS, DATA, "--checkpoint", path), path))
    add("garbage", _bytes(os.path.join(folder, "garbage.ckpt"), b"\x80\x04garbage" * 10))
    add("empty", _bytes(os.path.join(folder, "empty.ckpt"), b""))
    p = os.path.join(folder, "pickled.ckpt")
    torch.save({"meta": _Pickled()}, p)
    add("pickled_object", p)
    work = os.path.join(folder, "run")
    os.makedirs(work, exist_ok=True)
    cfg = os.path.join(work, "c.json")
    amct_torch.create_quant_config(cfg, MODEL, WEIGHTS, batch_num=4)
    graph = amct_torch.init(cfg, MODEL, WEIGHTS, os.path.join(work, "r.txt"))
    m = amct_torch.quantize_model(graph, os.path.join(work, "m.prototxt"), os.path.join(work, "m.caffemodel"))
    with np.load(DATA) as z:
        x = torch.from_numpy(np.ascontiguousarray(z["inputs"][:8]))
    with torch.no_grad():
        m(x)
    real = os.path.join(folder, "real.ckpt")
    save_checkpoint(graph.session, real)
    for name, edit in (("batches_seen_1e12", lambda st: st.__setitem__("batches_seen", torch.tensor(10 ** 12))),
                       ("batches_seen_negative", lambda st: st.__setitem__("batches_seen", torch.tensor(-1))),
                       ("state_wrong_length", lambda st: st.__setitem__("g0/top", torch.zeros(7))),
                       ("unknown_key", lambda st: st.__setitem__("g5x/top", torch.zeros(1)))):
        st = torch.load(real, weights_only=True)
        edit(st)
        p = os.path.join(folder, f"{name}.ckpt")
        torch.save(st, p)
        add(name, p)
    return cases


# ---------------------------------------------------------------- model faults
def _edited_weights(edit: Callable) -> bytes:
    """The example caffemodel after ``edit(layers_by_name)``."""
    from amct_torch.proto import amct_caffe_pb2 as pb
    net = pb.NetParameter()
    net.ParseFromString(weights_bytes())
    edit({l.name: l for l in net.layer})
    return net.SerializeToString()


def _set_values(blob, values, field_name: str = "data") -> None:
    blob.ClearField("data")
    getattr(blob, field_name).extend(values)


def model_fault_cases(folder: str) -> list[Case]:
    """Broken models accepted before, model faults blamed on the data, and model sizes that
    cannot fit: each must name the model file at fault (and its layer)."""
    import cv2

    from helpers.ssd import ssd_net
    good = model_text()
    cases = []

    def proto(name, text, argv=None, weights=WEIGHTS):
        p = _text(os.path.join(folder, f"{name}.prototxt"), text)
        cases.append(Case(f"prototxt/{name}", "prototxt", argv(p) if argv else _calibrate(p, weights), p))

    def model(name, raw, expect_ok=False):
        p = _bytes(os.path.join(folder, f"{name}.caffemodel"), raw)
        cases.append(Case(f"caffemodel/{name}", "caffemodel", _calibrate(weights=p), p, expect_ok=expect_ok))

    proto("two_producers_of_a_top", good + 'layer { name: "dup" type: "Sigmoid" bottom: "data" top: "prob" }\n')
    proto("bn_eps_negative", good.replace("eps: 1e-05", "eps: -1", 1))
    head = good[:good.index("layer {", good.index('name: "relu1"') - 20)]  # conv1 + BN + ReLU
    proto("pad_1200_fully_convolutional", head.replace("pad: 1", "pad: 1200", 1))
    proto("layers_over_limit", "layer { name: 'a' type: 'ReLU' }\n" * 100_001,
          argv=lambda p: _config(p))
    ssd_p, ssd_w = ssd_net(folder, name="ssd_ok")
    ssd = open(ssd_p, encoding="utf-8").read()
    at = ssd.index('name: "h1_prior"')  # its PriorBox loses max_size: 3 priors, heads made for 4
    proto("ssd_heads_vs_priorbox", ssd[:at] + ssd[at:].replace("max_size: 24.0\n", "", 1), weights=ssd_w)

    def ip_in_out(layers):  # fc1's (32, 256) weights stored transposed as (256, 32)
        b = layers["fc1"].blobs[0]
        w = np.asarray(b.data, np.float32).reshape(32, 256).T
        _set_values(b, w.reshape(-1).tolist())
        b.shape.ClearField("dim")
        b.shape.dim.extend([256, 32])
    model("inner_product_weights_in_out", _edited_weights(ip_in_out))

    def int32_only(layers):
        b = layers["conv1"].blobs[0]
        _set_values(b, [int(round(v * 100)) for v in b.data], "int32_data")
    model("int32_only_weights", _edited_weights(int32_only))
    model("data_and_double_data", _edited_weights(
        lambda layers: layers["conv1"].blobs[0].double_data.extend(layers["conv1"].blobs[0].data)), expect_ok=True)

    def dims_100(layers):
        layers["conv1"].blobs[0].shape.ClearField("dim")
        layers["conv1"].blobs[0].shape.dim.extend([1] * 99 + [144])
    model("blob_100_dims", _edited_weights(dims_100))
    model("bn_variance_negative", _edited_weights(
        lambda layers: _set_values(layers["bn1"].blobs[1], [-abs(v) for v in layers["bn1"].blobs[1].data])))
    model("bn_factor_negative", _edited_weights(lambda layers: _set_values(layers["bn1"].blobs[2], [-1.0])))
    model("empty_layers_7mb", bytes([0xA2, 0x06, 0x00]) * 2_300_000)
    shrunk = os.path.join(folder, "fp16_shrunk.caffemodel")
    cv2.dnn.shrinkCaffeModel(WEIGHTS, shrunk)
    cases.append(Case("caffemodel/fp16_shrunk", "caffemodel", _calibrate(weights=shrunk), shrunk, expect_ok=True))
    return cases


# ---------------------------------------------------------------- paths, arguments, reruns
#: the files of ``_calibrate(..., "--save-type", "Fakequant")`` (no report): a rerun's whole set
_FAKEQUANT_SET = sorted(["m_quant_config.json", "m_record.txt", "m_fake_quant_model.prototxt",
                         "m_fake_quant_weights.caffemodel", "m_quant.json"])


def path_and_run_cases(folder: str) -> list[Case]:
    """Inputs that could hang (FIFOs), crash (a big-endian .npy, absurd or negative counts, a
    checkpoint in a missing folder, a damaged staging manifest) or run unbounded (a .npz of
    100,000 members), and reruns that could leave an earlier run's files beside the new set."""
    cases = []
    d = os.path.join(folder, "paths")
    os.makedirs(d, exist_ok=True)
    fifo = os.path.join(d, "fifo.npy")
    if not os.path.exists(fifo):
        os.mkfifo(fifo)
    cases.append(Case("data/fifo_as_data_file", "data", _calibrate(data=fifo), fifo))
    fdir = os.path.join(d, "fifo_folder")
    os.makedirs(fdir, exist_ok=True)
    with np.load(DATA) as z:
        samples = np.ascontiguousarray(z["inputs"][:16])
    np.save(os.path.join(fdir, "a.npy"), samples)
    if not os.path.exists(os.path.join(fdir, "b.npy")):
        os.mkfifo(os.path.join(fdir, "b.npy"))
    cases.append(Case("data/fifo_in_data_folder", "data", _calibrate(data=fdir), os.path.join(fdir, "b.npy")))
    cases.append(Case("data/char_device_as_data", "data", _calibrate(data="/dev/zero"), "/dev/zero"))
    for dtype in (">f8", ">f4", "<u2", ">i4"):
        p = os.path.join(d, f"samples_{dtype.replace('>', 'be_').replace('<', 'le_')}.npy")
        np.save(p, samples.astype(dtype) if dtype[1] == "f" else np.round(samples * 1000).astype(dtype))
        cases.append(Case(f"data/npy_{os.path.basename(p)[8:-4]}", "data", _calibrate(data=p), p,
                          expect_ok=True))
    many = os.path.join(d, "members_100000.npz")
    member = npy_bytes(np.zeros((1, 16, 16), np.float32))
    with zipfile.ZipFile(many, "w", zipfile.ZIP_STORED) as z:
        for i in range(100_000):
            z.writestr(f"s{i:06d}.npy", member)
    cases.append(Case("data/npz_100000_members", "data", _calibrate(data=many), many))
    png = _png(16, 16, b"\0" * (17 * 16))
    tdir = os.path.join(d, "truncated_png")
    os.makedirs(tdir, exist_ok=True)
    p = _bytes(os.path.join(tdir, "a.png"), png[:png.index(b"IEND") - 4])
    cases.append(Case("data/images/png_without_iend", "data", _calibrate(data=tdir), p))
    cases.append(Case("checkpoint/fifo", "checkpoint", _calibrate(MODEL, WEIGHTS, DATA, "--checkpoint", fifo), fifo))
    missing = os.path.join(d, "no_such_folder", "run.ckpt")
    cases.append(Case("checkpoint/missing_folder", "checkpoint",
                      _calibrate(MODEL, WEIGHTS, DATA, "--checkpoint", missing), missing))
    for opt, value in (("--batch-num", "1000000000000000"), ("--batch-num", "4294967296"),
                       ("--report-batches", "-1"), ("--report-rows", "-1")):
        argv = _calibrate() + [opt, value]  # the later value wins over the defaults' one
        cases.append(Case(f"arguments/{opt[2:]}_{value}", "arguments", argv,
                          DATA if opt == "--batch-num" else opt,  # no batch count that large
                          or_names=opt[2:].replace("-", "_")))
    # evaluate against a reference whose output has another shape
    ref = _text(os.path.join(d, "ref_prob_doubled.prototxt"),  # 'prob' of 20 values, not 10
                model_text().replace('top: "prob"', 'top: "prob0"') +
                'layer { name: "cat" type: "Concat" bottom: "prob0" bottom: "prob0" top: "prob" }\n')
    cases.append(Case("arguments/evaluate_reference_other_shape", "arguments",
                      ["evaluate", MODEL, WEIGHTS, DATA, "--reference", ref, WEIGHTS, "--max-batches", "1"],
                      ref))
    # reruns over an earlier run's set: only this run's files may be left
    earlier = {"m" + s: "an earlier run" for s in ("_quant_config.json", "_record.txt", "_deploy_model.prototxt",
                                                    "_deploy_weights.caffemodel", "_layer_report.json",
                                                    "_float.onnx", "_quant.onnx")}
    cases.append(Case("rerun/fakequant_after_full_onnx_run", "rerun",
                      _calibrate(MODEL, WEIGHTS, DATA, "--save-type", "Fakequant"), "", expect_ok=True,
                      setup=dict(earlier, **{"notes.txt": "the user's"}),
                      expect_left=sorted(_FAKEQUANT_SET + ["notes.txt"])))
    for name, manifest in (("garbage", "{garbage"), ("json_list", "[1, 2]"), ("wrong_types", '{"moves": 7}'),
                           ("path_escape", '{"moves": ["../../x"], "removes": ["../notes.txt"]}')):
        cases.append(Case(f"rerun/damaged_manifest_{name}", "rerun",
                          _calibrate(MODEL, WEIGHTS, DATA, "--save-type", "Fakequant"), "", expect_ok=True,
                          setup={".m.amct-partial/COMMITTED.json": manifest,
                                 ".m.amct-partial/m_record.txt": "staged by a dead run"},
                          expect_left=_FAKEQUANT_SET))
    return cases


# ---------------------------------------------------------------- paths, options, evaluate
def output_path_cases(folder: str) -> list[Case]:
    """Output prefixes that name a folder or pass the filesystem's limits: one line, nothing
    made (the long path's folders included)."""
    d = os.path.join(folder, "prefixes")
    os.makedirs(os.path.join(d, "existing"), exist_ok=True)
    deep = os.path.join(d, "deep", *(["abcdefgh"] * 460), "m")  # over PATH_MAX (4096 bytes)
    cases = [Case(f"output_paths/{name}", "output_paths", _calibrate() + ["-o", out], names)
             for name, out, names in (("dot", ".", "."), ("dotdot", "..", ".."),
                                      ("folder_slash_dot", os.path.join(d, "existing", "."), d),
                                      ("existing_folder", os.path.join(d, "existing"), d),
                                      ("over_path_max", deep, d[:40]),
                                      ("name_240_chars", os.path.join(d, "x" * 240), d[:40]))]
    cases.append(Case("output_paths/config_dot", "output_paths", _config() + ["-o", "."], "."))
    return cases


def dropped_option_cases(folder: str) -> list[Case]:
    """Options the job would drop without a word: each refused with one line."""
    d = os.path.join(folder, "dropped")
    os.makedirs(d, exist_ok=True)
    cfg = _text(os.path.join(d, "q.cfg"), "batch_num: 1\n")
    return [
        Case("options/config_with_skip_layers", "options", _calibrate() + ["-c", cfg, "--skip-layers", "conv1"], cfg),
        Case("options/config_with_no_activation_offset", "options",
             _calibrate() + ["-c", cfg, "--no-activation-offset"], cfg),
        Case("options/quant_cfg_with_skip_layers", "options",
             _config(MODEL, WEIGHTS, "--quant-cfg", cfg, "--skip-layers", "conv1"), cfg),
        Case("options/onnx_outputs_input_blob", "options", _calibrate() + ["--onnx", "--onnx-outputs", "data"],
             MODEL),
        Case("options/openvino_with_int8", "options",
             _calibrate() + ["--onnx", "--onnx-target", "openvino", "--onnx-activations", "int8"],
             "--onnx-activations"),
        Case("options/onnx_target_without_onnx", "options", _calibrate() + ["--onnx-target", "tensorrt"],
             "--onnx-target"),
        Case("options/distributed_outside_torchrun", "options", _calibrate() + ["--distributed"], "--distributed"),
    ]


def evaluate_cases(folder: str) -> list[Case]:
    """``evaluate``'s user errors, each one line before the first forward."""
    d = os.path.join(folder, "evaluate")
    os.makedirs(d, exist_ok=True)
    ref = _text(os.path.join(d, "ref_20x20.prototxt"), model_text().replace("dim: 16", "dim: 20"))
    fifo = os.path.join(d, "model_fifo.prototxt")
    if not os.path.exists(fifo):
        os.mkfifo(fifo)
    ev = ["evaluate", MODEL, WEIGHTS, DATA, "-q", "--max-batches", "1"]
    return [
        Case("evaluate/device_foo", "evaluate", ev + ["--device", "foo"], "foo"),
        Case("evaluate/device_cuda_without_gpu", "evaluate", ev + ["--device", "cuda"], "cuda"),
        Case("evaluate/reference_other_input_shape", "evaluate", ev + ["--reference", ref, WEIGHTS], ref,
             or_names=WEIGHTS),
        Case("evaluate/model_is_a_fifo", "evaluate", ["evaluate", fifo, WEIGHTS, DATA, "-q"], fifo),
        Case("evaluate/model_is_a_folder", "evaluate", ["evaluate", d, WEIGHTS, DATA, "-q"], d),
        Case("evaluate/resize_and_crop_ok", "evaluate",
             ["evaluate", MODEL, WEIGHTS, _image_folder(d, "imgs", 3), "-q", "--device", "cpu",
              "--resize", "20", "--crop", "16", "--reference", MODEL, WEIGHTS], "", expect_ok=True),
    ]


def _image_folder(folder: str, name: str, n: int, bad: Optional[int] = None) -> str:
    """``n`` 16x16 grey PNGs (the ``bad``-th cut short) in ``folder/name``."""
    d = os.path.join(folder, name)
    os.makedirs(d, exist_ok=True)
    for i in range(n):
        png = _png(16, 16, bytes([0] + [(i * 40 + x) % 256 for x in range(16)]) * 16)
        _bytes(os.path.join(d, f"img{i}.png"), png[:png.index(b"IEND") - 4] if i == bad else png)
    return d


def data_round3_cases(folder: str) -> list[Case]:
    """Data that ran out of memory, leaked a numpy warning, or failed a finished job."""
    d = os.path.join(folder, "data3")
    os.makedirs(d, exist_ok=True)
    huge = os.path.join(d, "f8_1e300.npy")
    np.save(huge, np.full((4, 1, 16, 16), 1e300))
    held = _image_folder(d, "held_out_bad", 4, bad=2)
    resize = _image_folder(d, "resize_7000", 2)
    return [
        Case("data/npy_f8_1e300", "data", _calibrate(data=huge), huge),
        Case("data/images/held_out_image_unreadable", "data",
             _calibrate(MODEL, WEIGHTS, held, "--batch-size", "2", "--report-batches", "1"),
             os.path.join(held, "img2.png")),
        Case("data/images/resize_7000_without_crop", "data", _calibrate(MODEL, WEIGHTS, resize, "--resize", "7000"),
             MODEL),
    ]


def all_cases(folder: str) -> list[Case]:
    """Every hand-written case, files written under ``folder``."""
    out = []
    for make in (prototxt_cases, caffemodel_cases, quant_cfg_cases, json_cases, record_cases,
                 data_cases, output_cases, checkpoint_cases, model_fault_cases, path_and_run_cases,
                 output_path_cases, dropped_option_cases, evaluate_cases, data_round3_cases):
        sub = os.path.join(folder, make.__name__)
        os.makedirs(sub, exist_ok=True)
        out += make(sub)
    for i, c in enumerate(out):
        c.out = os.path.join(folder, "out", f"c{i}", "m")
    return out


# ---------------------------------------------------------------- runner
def api_call(argv: list):
    """The API call equivalent to an ``amct-torch`` command line (the same files)."""
    import amct_torch
    cmd, pos, opts = argv[0], [], {}
    i = 1
    while i < len(argv):
        a = argv[i]
        if a in ("-q",):
            i += 1
        elif a in _FLAGS:
            opts[a] = True
            i += 1
        elif a.startswith("-"):
            opts[a] = argv[i + 1]
            i += 2
        else:
            pos.append(a)
            i += 1
    out = opts.get("-o")
    if cmd == "calibrate":
        cfg = opts.get("-c")
        return lambda: amct_torch.quantize(
            pos[0], pos[1], pos[2], config=cfg, output=out, device="cpu", quiet=True,
            checkpoint=opts.get("--checkpoint"),
            batch_num=int(opts["--batch-num"]) if "--batch-num" in opts else None,
            batch_size=int(opts["--batch-size"]) if "--batch-size" in opts else None,
            report=opts.get("--report-batches", "1") != "0",
            report_batches=int(opts.get("--report-batches", "2")) if opts.get("--report-batches") != "0" else 2,
            save_type=opts.get("--save-type", "Both"),
            skip_layers=opts["--skip-layers"].split(",") if "--skip-layers" in opts else None,
            activation_offset="--no-activation-offset" not in opts,
            onnx=opts.get("--onnx-activations", True) if "--onnx" in opts else False,
            onnx_target=opts.get("--onnx-target", "onnxruntime"),
            onnx_outputs=opts["--onnx-outputs"].split(",") if "--onnx-outputs" in opts else None,
            distributed="--distributed" in opts,
            preprocess=amct_torch.Preprocess(resize=int(opts["--resize"])) if "--resize" in opts else None)
    if cmd == "convert":
        return lambda: amct_torch.convert_model(pos[0], pos[1], pos[2], out)
    if cmd == "config":
        return lambda: amct_torch.create_quant_config(out, pos[0], pos[1],
                                                      config_defination=opts.get("--quant-cfg"))
    raise ValueError(cmd)


#: options without a value
_FLAGS = ("--onnx", "--distributed", "--no-activation-offset")


def _cli_only(argv: list) -> bool:
    """A command line the API has no call or argument for (``evaluate``, ``--report-rows``,
    an ONNX option without ``--onnx``, which the API cannot express, ``config``'s options beside
    a quant.cfg, which AMCT's ``create_quant_config`` ignores): the API mode runs it through the
    CLI too."""
    return argv[0] == "evaluate" or "--report-rows" in argv or (
        "--onnx-target" in argv and "--onnx" not in argv) or (argv[0] == "config" and "--skip-layers" in argv)


def _run_api(argv: list) -> tuple:
    """(exit-code-like status, message, traceback) of the API call of ``argv``."""
    import traceback

    from amct_torch.errors import AmctError
    try:
        api_call(argv)()
    except AmctError as err:
        return 2, f"api: error: {err}\n", None
    except BaseException:  # noqa: BLE001 - what escaped is the finding
        return 1, "", traceback.format_exc()
    return 0, "", None


def peak_rss_mb() -> float:
    """This process's peak resident memory (VmHWM: reset by exec, unlike ru_maxrss, which
    Linux carries over from the parent that forked us)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _child(cases_file: str, result_file: str, limit_mb: int, mode: str = "cli") -> None:
    import contextlib
    import resource
    import traceback
    if limit_mb > 0:
        resource.setrlimit(resource.RLIMIT_AS, (limit_mb << 20, limit_mb << 20))
    from amct_torch.cli import main
    with open(cases_file, encoding="utf-8") as f:
        cases = json.load(f)
    results = []
    for c in cases:
        os.makedirs(os.path.dirname(c["out"]), exist_ok=True)
        for rel, text in c.get("setup", {}).items():
            target = os.path.join(os.path.dirname(c["out"]), rel)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "w", encoding="utf-8") as f:
                f.write(text)
        argv = [a.replace("{out}", c["out"]) for a in c["argv"]]
        err = io.StringIO()
        tb = None
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            if mode == "api" and not _cli_only(argv):
                rc, msg, tb = _run_api(argv)
                err.write(msg)
            else:
                try:
                    rc = main(argv)
                except SystemExit as e:
                    rc = e.code if isinstance(e.code, int) else 1
                except BaseException:  # noqa: BLE001 - what escaped is the finding
                    tb = traceback.format_exc()
                    rc = 1
        left = sorted(os.listdir(os.path.dirname(c["out"])))
        results.append({"name": c["name"], "rc": rc, "stderr": err.getvalue(), "traceback": tb,
                        "left": left,
                        "maxrss_mb": peak_rss_mb()})
        with open(result_file, "w", encoding="utf-8") as f:
            json.dump(results, f)


def run_cases(cases: list[Case], work: str, limit_mb: int = MEMORY_LIMIT_MB,
              timeout: float = 600, mode: str = "cli") -> list[dict]:
    """Run ``cases`` in one child process under the memory limit, through the CLI's ``main``
    or (``mode="api"``) the equivalent API calls; the results in order."""
    cases_file = os.path.join(work, f"cases_{mode}.json")
    result_file = os.path.join(work, f"results_{mode}.json")
    dumped = []
    for c in cases:  # each mode writes into its own output folders
        d = asdict(c)
        d["out"] = c.out.replace(os.sep + "out" + os.sep, os.sep + f"out_{mode}" + os.sep)
        dumped.append(d)
    with open(cases_file, "w", encoding="utf-8") as f:
        json.dump(dumped, f)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    # CUDA hidden: the cases run on the CPU, and a CUDA driver reserves far more address
    # space than the memory limit allows
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), cases_file, result_file,
                           str(limit_mb), mode], env=env, capture_output=True, text=True,
                          timeout=timeout)
    results = json.load(open(result_file, encoding="utf-8")) if os.path.exists(result_file) else []
    if len(results) != len(cases):
        died = cases[len(results)].name if len(results) < len(cases) else "?"
        raise AssertionError(f"the child died at case {died} (rc {proc.returncode}): {proc.stderr[-3000:]}")
    return results


def problems(case: Case, result: dict) -> list[str]:
    """What is wrong with one result (empty: a clean error, or success where expected)."""
    bad = []
    if case.expect_ok:
        if result["rc"] != 0 or result["traceback"]:
            bad.append(f"expected success, got exit {result['rc']}: {result['stderr'][-300:]}")
        elif case.expect_left is not None and sorted(result["left"]) != sorted(case.expect_left):
            bad.append(f"left {sorted(result['left'])}, expected this run's set {sorted(case.expect_left)}")
        return bad
    if result["traceback"]:
        bad.append("traceback: " + result["traceback"].strip().splitlines()[-1])
    if result["rc"] != 2:
        bad.append(f"exit {result['rc']}")
    lines = [l for l in result["stderr"].splitlines() if l.strip()]
    errors = [l for l in lines if ": error: " in l]
    if len(errors) != 1:
        bad.append(f"{len(errors)} error lines")
    elif case.names not in errors[0] and not (case.or_names and case.or_names in errors[0]):
        bad.append(f"message does not name {case.names}: {errors[0][:300]}")
    elif len(errors[0]) > 1000:
        bad.append(f"message is {len(errors[0])} characters long")
    if "Traceback" in result["stderr"]:
        bad.append("traceback printed")
    if [n for n in result["left"] if not n.startswith(".")] or result["left"]:
        bad.append(f"files left: {result['left']}")
    return bad


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 else "cli")
