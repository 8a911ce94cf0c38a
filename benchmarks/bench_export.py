"""Export benchmark (JSON lines): ONNX Runtime CPU latency on nsfw at batch 1 and 8 of our
int8 QDQ model in every export variant (int8/uint8 activations, float/int32 bias, the opt-in
``quantize_residual_outputs``, the speed mode ``quantize_eltwise``) vs the float model and vs ORT's own ``quantize_static`` QDQ
output (per channel, the same calibration crops, S8S8 and U8S8), with the number of
convolutions and Adds ORT runs as int8 kernels and each model's logits SQNR vs the float model
on crops that are not the calibration crops; and the time of ``convert_model`` on nsfw.

``--targets``: per runtime (ONNX Runtime, OpenVINO CPU) and model (nsfw ResNet-50, a
depthwise detector, a PReLU 48×48 face net; product calibration), the latency of the int8
model of each ``--onnx-target`` vs the float model in that runtime, and the convolutions/FCs
the runtime runs in int8 (ORT: its optimized graph; OpenVINO: the compiled runtime model's
runtimePrecision), then exits. OpenVINO's float model runs at its default inference
precision (bf16 on CPUs with AVX512-BF16/AMX) and, as ``float_f32``, with the f32 hint.

Each latency is the median of ``rounds × per-round`` runs, the models of one runtime
interleaved round by round (order rotated), so that the load of a shared machine falls on all
of them alike; every line names the batch and the thread count.

Run: PYTHONPATH=. .venv/bin/python benchmarks/bench_export.py [--threads 2] [--rounds 20] [--sessions 4] [--only a,b]
     [--targets [--models a,b] [--batches 1,8] [--ort-own]]
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time

import numpy as np
import onnxruntime as ort

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
import amct_torch
from amct_torch.export import convert_model, export_onnx
from conftest import natural_images_bgr, nsfw_dir


def session(path, threads):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def kernel_counts(path, threads):
    """Op counts of ORT's optimized graph (how many convolutions run as int8 kernels)."""
    import collections

    import onnx
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.optimized_model_filepath = path + ".opt.onnx"
    ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    ops = collections.Counter(n.op_type for n in onnx.load(path + ".opt.onnx").graph.node)
    return {"QLinearConv": ops["QLinearConv"], "float_conv": ops["Conv"] + ops["FusedConv"],
            "QLinearAdd": ops["QLinearAdd"], "float_add": ops["Add"],
            "Transpose": ops["Transpose"], "QGemm": ops["QGemm"]}


def logits_sqnr(models, x, threads, out="fc_nsfw"):
    """SQNR (dB) of each model's pre-softmax output vs the float model's, as ORT runs it."""
    import onnx.utils
    got = {}
    for k, p in models.items():
        lp = p + ".logits.onnx"
        onnx.utils.extract_model(p, lp, ["data"], [out])
        s = session(lp, threads)
        got[k] = np.concatenate([s.run(None, {"data": x[i:i + 8]})[0] for i in range(0, len(x), 8)]
                                ).astype(np.float64)
    ref = got["float"]
    return {k: float(10 * np.log10((ref ** 2).sum() / max(((v - ref) ** 2).sum(), 1e-300)))
            for k, v in got.items()}


def latencies(models, x, threads, rounds, per_round, n_sessions):
    """(median, minimum) latency per model. Runs are interleaved (each round times
    ``per_round`` runs of every model in turn, order rotated) so that the noise of this shared
    machine hits all models alike; every session is warmed up first. Each model gets
    ``n_sessions`` sessions used in turn: on this machine one session of a model can settle at a
    median 30 % slower than another session of the same model (seen with ORT's own model as with
    ours), which one session per model would report as a difference between models."""
    sessions = {k: [session(p, threads) for _ in range(n_sessions)] for k, p in models.items()}
    for ss in sessions.values():
        for s in ss:
            for _ in range(5):
                s.run(None, {"data": x})
    times = {k: [] for k in models}
    keys = list(models)
    for r in range(rounds):
        order = keys[r % len(keys):] + keys[:r % len(keys)]
        for k in order:
            for i in range(per_round):
                s = sessions[k][(r * per_round + i) % n_sessions]
                t0 = time.perf_counter()
                s.run(None, {"data": x})
                times[k].append(time.perf_counter() - t0)
    return {k: (float(np.median(v)), float(np.min(v))) for k, v in times.items()}


def ort_static(float_path, out_path, calib, act_type):
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.items = iter([{"data": calib[i:i + 1]} for i in range(len(calib))])

        def get_next(self):
            return next(self.items, None)

    quantize_static(float_path, out_path, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=act_type, weight_type=QuantType.QInt8)


VARIANTS = {  # name -> export_onnx keyword arguments
    "ours_int8": dict(activations="int8"),
    "ours_uint8": dict(activations="uint8"),
    "ours_int8_bias_int32": dict(activations="int8", bias="int32"),
    "ours_uint8_bias_int32": dict(activations="uint8", bias="int32"),
    "ours_int8_residual": dict(activations="int8", quantize_residual_outputs=True),
    "ours_uint8_residual": dict(activations="uint8", quantize_residual_outputs=True),
    "ours_int8_eltwise": dict(activations="int8", quantize_eltwise=True),
    "ours_uint8_eltwise": dict(activations="uint8", quantize_eltwise=True),
    "ours_uint8_eltwise_bias_int32": dict(activations="uint8", bias="int32", quantize_eltwise=True),
}


def target_nets(tmp):
    """(name, prototxt, caffemodel, calibration images, input size, scale) of the --targets models."""
    from helpers.target_nets import depthwise_detector, onet_like
    d = nsfw_dir()
    yield "nsfw_resnet50", os.path.join(d, "deploy.prototxt"), os.path.join(d, "resnet_50_1by2_nsfw.caffemodel"), (224, 224), 1.0
    yield ("depthwise_detector", *depthwise_detector(tmp), (120, 160), 1 / 128)
    yield ("prelu_facenet48", *onet_like(tmp), (48, 48), 1 / 128)


def target_images(size, scale, count, seed):
    x = natural_images_bgr(size=max(size), count=count, seed=seed)[:, :, :size[0], :size[1]]
    return np.ascontiguousarray(x * scale, dtype=np.float32)


def _timed(runners, x, rounds, per_round):
    """Median latency per runner (interleaved rounds, order rotated, warmed up)."""
    for r in runners.values():
        for _ in range(3):
            r(x)
    times = {k: [] for k in runners}
    keys = list(runners)
    for i in range(rounds):
        for k in keys[i % len(keys):] + keys[:i % len(keys)]:
            for _ in range(per_round):
                t0 = time.perf_counter()
                runners[k](x)
                times[k].append(time.perf_counter() - t0)
    return {k: float(np.median(v)) for k, v in times.items()}


def bench_targets(args):
    """The --targets table (JSON lines)."""
    from helpers.runtimes import openvino_available, openvino_compile, openvino_counts, ort_counts
    with tempfile.TemporaryDirectory() as tmp:
        for name, proto, weights, size, scale in target_nets(tmp):
            if args.models and name not in args.models.split(","):
                continue
            calib = target_images(size, scale, 8, 1)
            records = {}
            for offset in (True, False):  # tensorrt needs symmetric activations
                cal = amct_torch.quantize(proto, weights, calib, output=os.path.join(tmp, f"cal{offset}", name),
                                          batch_num=2, save_type=None, report=False, quiet=True,
                                          device="cpu", activation_offset=offset)
                records[offset] = (cal.float_model, cal.records)
            paths = {}
            for target in ("onnxruntime", "openvino", "tensorrt"):
                gm, recs = records[target != "tensorrt"]
                paths["float"], paths[target] = export_onnx(gm, recs, os.path.join(tmp, f"{name}_{target}"),
                                                            target=target)
            if args.ort_own:  # ONNX Runtime's own quantizer on the same float model and crops (U8S8)
                from onnxruntime.quantization import QuantType
                paths["ort_quantize_static_u8s8"] = os.path.join(tmp, f"{name}_ort_u8s8.onnx")
                ort_static(paths["float"], paths["ort_quantize_static_u8s8"], calib, QuantType.QUInt8)
            for batch in [int(b) for b in args.batches.split(",")]:
                x = target_images(size, scale, batch, 2)
                sessions = {k: session(p, args.threads) for k, p in paths.items()}
                lat = _timed({k: (lambda v, s=s: s.run(None, {s.get_inputs()[0].name: v})) for k, s in sessions.items()},
                             x, args.rounds, args.per_round)
                for k in paths:
                    print(json.dumps({"bench": "targets", "runtime": "onnxruntime", "model": name, "batch": batch,
                                      "onnx": k, "threads": args.threads, "latency_ms": round(lat[k] * 1e3, 2),
                                      "speed_vs_float": round(lat["float"] / lat[k], 3),
                                      "runs": args.rounds * args.per_round,
                                      **({} if k == "float" else ort_counts(paths[k], args.threads))}), flush=True)
                why = openvino_available()
                if why:
                    print(json.dumps({"bench": "targets", "runtime": "openvino", "skipped": why}))
                    continue
                compiled = {k: openvino_compile(p, args.threads) for k, p in paths.items() if not k.startswith("ort_")}
                compiled["float_f32"] = openvino_compile(paths["float"], args.threads, precision="f32")
                reqs = {k: c.create_infer_request() for k, c in compiled.items()}
                lat = _timed({k: (lambda v, r=r: r.infer({0: v})) for k, r in reqs.items()}, x, args.rounds, args.per_round)
                for k, c in compiled.items():
                    print(json.dumps({"bench": "targets", "runtime": "openvino", "model": name, "batch": batch,
                                      "onnx": k, "threads": args.threads, "latency_ms": round(lat[k] * 1e3, 2),
                                      "speed_vs_float": round(lat["float"] / lat[k], 3),
                                      "runs": args.rounds * args.per_round,
                                      **({} if k.startswith("float") else openvino_counts(c))}), flush=True)


def main():
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--per-round", type=int, default=4)
    ap.add_argument("--sessions", type=int, default=4)
    ap.add_argument("--no-convert", action="store_true")
    ap.add_argument("--targets", action="store_true", help="the per-runtime target table only")
    ap.add_argument("--only", default="", help="comma-separated variant names (float and the ORT "
                    "models are always measured)")
    ap.add_argument("--models", default="", help="--targets: comma-separated model names "
                    "(nsfw_resnet50, depthwise_detector, prelu_facenet48; default all)")
    ap.add_argument("--batches", default="1,8", help="--targets: comma-separated batch sizes (default 1,8)")
    ap.add_argument("--ort-own", action="store_true", help="--targets: also ONNX Runtime's own "
                    "quantize_static (U8S8, per channel) model of each net, for reference")
    args = ap.parse_args()
    if args.targets:
        return bench_targets(args)
    d = nsfw_dir()
    proto, weights = os.path.join(d, "deploy.prototxt"), os.path.join(d, "resnet_50_1by2_nsfw.caffemodel")
    calib = natural_images_bgr(count=8, seed=1)
    from onnxruntime.quantization import QuantType
    with tempfile.TemporaryDirectory() as tmp:
        # the product's own calibration (IFMR + ARQ, AMCT's defaults) on the 8 crops
        cal = amct_torch.quantize(proto, weights, calib, output=os.path.join(tmp, "cal", "nsfw"),
                                  batch_num=2, save_type=None, report=False, quiet=True,
                                  device="cpu")
        gm, recs = cal.float_model, cal.records
        models = {}
        for tag, kw in VARIANTS.items():
            if args.only and tag not in args.only.split(","):
                continue
            if kw.get("quantize_residual_outputs") or kw.get("quantize_eltwise"):
                kw = dict(kw, calibration_data=calib)
            f, q = export_onnx(gm, recs, os.path.join(tmp, tag), **kw)
            models["float"], models[tag] = f, q
        for tag, qt in (("ort_s8s8", QuantType.QInt8), ("ort_u8s8", QuantType.QUInt8)):
            models[tag] = os.path.join(tmp, f"{tag}.onnx")
            ort_static(models["float"], models[tag], calib, qt)
        kernels = {k: kernel_counts(p, args.threads) for k, p in models.items()}
        # 32 crops: on 8, the SQNR of models this close to each other moves by ±3 dB
        sqnr = logits_sqnr(models, natural_images_bgr(count=32, seed=3), args.threads)
        for batch in (1, 8):
            x = natural_images_bgr(count=batch, seed=2)
            both = latencies(models, x, args.threads, args.rounds, args.per_round, args.sessions)
            lat = {k: v[0] for k, v in both.items()}
            best_ort = min(lat["ort_s8s8"], lat["ort_u8s8"])
            for k, v in lat.items():
                print(json.dumps({"bench": "onnxruntime_cpu_nsfw", "batch": batch, "model": k,
                                  "threads": args.threads, "runs": args.rounds * args.per_round,
                                  "sessions": args.sessions, "latency_ms": round(v * 1e3, 2),
                                  "min_ms": round(both[k][1] * 1e3, 2),
                                  "speed_vs_float": round(lat["float"] / v, 3),
                                  "speed_vs_best_ort_quant": round(best_ort / v, 3),
                                  "logits_sqnr_db": round(sqnr[k], 1) if k != "float" else None,
                                  "load_avg": round(os.getloadavg()[0], 2),
                                  **kernels[k]}), flush=True)
        if args.no_convert:
            return
        rec_path = cal.files["record"]
        t0 = time.perf_counter()
        convert_model(proto, weights, rec_path, os.path.join(tmp, "nsfw"))
        print(json.dumps({"bench": "convert_model_nsfw", "seconds": round(time.perf_counter() - t0, 2)}))


if __name__ == "__main__":
    main()
