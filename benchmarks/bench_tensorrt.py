"""TensorRT benchmark (JSON lines): the ``--onnx-target tensorrt`` QDQ model built into an int8
engine and timed against the float model's fp16 and fp32 engines, per model (nsfw ResNet-50, a
depthwise detector, a PReLU 48×48 face net; product calibration with symmetric activations),
with the number of convolution/FC layers the engine runs on int8 inputs (TensorRT's engine
inspector, detailed profiling verbosity).

Where TensorRT or an NVIDIA GPU is missing it prints one JSON line saying why and exits 0.

Run: PYTHONPATH=. .venv/bin/python benchmarks/bench_tensorrt.py [--batch 1,8] [--runs 200]
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
import amct_torch
from amct_torch.export import export_onnx
from bench_export import target_images, target_nets


def why_not() -> str | None:
    """None when an engine can be built here, else the reason."""
    try:
        import tensorrt  # noqa: F401
    except ImportError as e:
        return f"tensorrt is not importable ({e})"
    try:
        import torch
    except ImportError as e:
        return f"torch is not importable ({e})"
    if not torch.cuda.is_available():
        return "no CUDA GPU (torch.cuda.is_available() is False)"
    return None


def build(path: str, batch: int, precision: str):
    """A serialized engine of the ONNX model at ``batch`` ("int8": the explicit Q/DQ model,
    fp16 allowed for the float layers; "fp16"; "fp32"), and its inspector's layer list."""
    import tensorrt as trt
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    with open(path, "rb") as f:
        if not parser.parse(f.read()):
            raise RuntimeError("; ".join(str(parser.get_error(i)) for i in range(parser.num_errors)))
    config = builder.create_builder_config()
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    if precision in ("int8", "fp16"):
        config.set_flag(trt.BuilderFlag.FP16)
    if precision == "int8":
        config.set_flag(trt.BuilderFlag.INT8)
    profile = builder.create_optimization_profile()
    for i in range(network.num_inputs):
        t = network.get_input(i)
        shape = [batch] + list(t.shape)[1:]
        profile.set_shape(t.name, shape, shape, shape)
    config.add_optimization_profile(profile)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise RuntimeError(f"TensorRT could not build {os.path.basename(path)} ({precision})")
    engine = trt.Runtime(logger).deserialize_cuda_engine(plan)
    info = json.loads(engine.create_engine_inspector().get_engine_information(trt.LayerInformationFormat.JSON))
    return engine, info.get("Layers", [])


def int8_layers(layers) -> dict:
    """Convolution / FC (gemm) layers of the engine and how many read int8 inputs."""
    conv = [x for x in layers if isinstance(x, dict) and any(k in str(x.get("LayerType", "")).lower()
                                                             for k in ("conv", "gemm", "matrix"))]
    int8 = [x for x in conv if any("int8" in str(i.get("Format/Datatype", "")).lower() for i in x.get("Inputs", []))]
    return {"conv_fc_layers": len(conv), "conv_fc_int8": len(int8)}


def latency(engine, x: np.ndarray, runs: int) -> float:
    """Median latency (s) of one inference, inputs and outputs on the GPU."""
    import tensorrt as trt
    import torch
    ctx = engine.create_execution_context()
    bufs = {}
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT:
            ctx.set_input_shape(name, x.shape)
            bufs[name] = torch.from_numpy(x).cuda()
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        if name not in bufs:
            shape = tuple(ctx.get_tensor_shape(name))
            bufs[name] = torch.empty(shape, dtype=torch.float32, device="cuda")
        ctx.set_tensor_address(name, bufs[name].data_ptr())
    stream = torch.cuda.Stream()
    for _ in range(20):
        ctx.execute_async_v3(stream.cuda_stream)
    stream.synchronize()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        ctx.execute_async_v3(stream.cuda_stream)
        stream.synchronize()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main() -> int:
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--runs", type=int, default=200)
    args = ap.parse_args()
    reason = why_not()
    if reason:
        print(json.dumps({"bench": "tensorrt", "skipped": reason}))
        return 0
    import tensorrt as trt
    with tempfile.TemporaryDirectory() as tmp:
        for name, proto, weights, size, scale in target_nets(tmp):
            cal = amct_torch.quantize(proto, weights, target_images(size, scale, 8, 1), output=os.path.join(tmp, "cal", name),
                                      batch_num=2, save_type=None, report=False, quiet=True,
                                      activation_offset=False)
            fp, qp = export_onnx(cal.float_model.cpu(), cal.records, os.path.join(tmp, name), target="tensorrt")
            for batch in (int(b) for b in args.batch.split(",")):
                x = target_images(size, scale, batch, 2)
                lat, counts = {}, {}
                for tag, path, prec in (("int8", qp, "int8"), ("fp16", fp, "fp16"), ("fp32", fp, "fp32")):
                    try:
                        engine, layers = build(path, batch, prec)
                    except RuntimeError as e:
                        print(json.dumps({"bench": "tensorrt", "model": name, "batch": batch, "engine": tag,
                                          "error": str(e)[:500]}), flush=True)
                        continue
                    lat[tag], counts[tag] = latency(engine, x, args.runs), int8_layers(layers)
                for tag, v in lat.items():
                    print(json.dumps({"bench": "tensorrt", "tensorrt": trt.__version__, "model": name, "batch": batch,
                                      "engine": tag, "latency_ms": round(v * 1e3, 3),
                                      "speed_vs_fp16": round(lat["fp16"] / v, 3) if "fp16" in lat else None,
                                      "speed_vs_fp32": round(lat["fp32"] / v, 3) if "fp32" in lat else None,
                                      **counts[tag]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
