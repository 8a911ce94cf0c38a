"""What a runtime actually runs: the convolutions and fully-connected layers of a compiled model
with the precision the runtime chose, read from the runtime itself (OpenVINO's compiled runtime
model; ONNX Runtime's optimized graph), so that a test or benchmark counts int8 kernels
independently of how the exporter meant the graph."""
from __future__ import annotations

import collections
import os
import tempfile
from typing import Optional

#: OpenVINO CPU runtime layer types that are a convolution or a fully-connected layer
OV_CONV = ("Convolution", "GroupConvolution", "Deconvolution")
OV_FC = ("FullyConnected", "MatMul")
#: ONNX Runtime optimized-graph ops that are int8 kernels
ORT_INT8_CONV = ("QLinearConv", "ConvInteger")
ORT_INT8_FC = ("MatMulInteger", "QGemm", "MatMulIntegerToFloat", "QLinearMatMul", "DynamicQuantizeMatMul")
ORT_FLOAT_CONV = ("Conv", "FusedConv")
ORT_FLOAT_FC = ("Gemm", "MatMul", "FusedGemm", "FusedMatMul")


def openvino_available() -> Optional[str]:
    """None when openvino imports, else why not (for a skip reason)."""
    try:
        import openvino  # noqa: F401
    except ImportError as e:  # an optional dependency
        return f"openvino is not importable ({type(e).__name__}: {e})"
    return None


def openvino_compile(path: str, threads: int = 2, precision: Optional[str] = None):
    """The model compiled by OpenVINO's CPU plugin (default hints; ``precision`` sets
    INFERENCE_PRECISION_HINT, e.g. "f32")."""
    import openvino as ov
    cfg = {"INFERENCE_NUM_THREADS": threads}
    if precision:
        cfg["INFERENCE_PRECISION_HINT"] = precision
    return ov.Core().compile_model(path, "CPU", cfg)


def openvino_layers(compiled) -> list[tuple[str, str, str]]:
    """(kind "conv"/"fc", runtime precision, original ONNX node names) of every convolution and
    fully-connected layer in OpenVINO's compiled runtime model."""
    out = []
    for op in compiled.get_runtime_model().get_ops():
        rt = op.get_rt_info()
        kind = rt["layerType"].astype(str)
        if kind in OV_CONV or kind in OV_FC:
            out.append(("conv" if kind in OV_CONV else "fc", rt["runtimePrecision"].astype(str),
                        rt["originalLayersNames"].astype(str)))
    return out


def openvino_counts(compiled) -> dict[str, int]:
    """int8 (u8/i8 runtime precision) and other convolutions and FCs in OpenVINO."""
    c: collections.Counter = collections.Counter()
    for kind, prec, _ in openvino_layers(compiled):
        c[f"{kind}_{'int8' if prec in ('u8', 'i8') else 'float'}"] += 1
    return {k: c[k] for k in ("conv_int8", "conv_float", "fc_int8", "fc_float")}


def _channel_scaling(n) -> bool:
    """ORT's NCHWc layout pass writes a per-channel Mul (e.g. the integer form's rescale after a
    pooling in NCHWc) as a depthwise 1×1 ``Conv`` of its own (weights named ``mul_scale…``):
    not one of the model's convolutions."""
    return n.op_type == "Conv" and n.domain == "com.microsoft.nchwc" and len(n.input) > 1 \
        and n.input[1].startswith("mul_scale")


def ort_optimized_ops(path: str, threads: int = 1) -> collections.Counter:
    """Op counts of ONNX Runtime's optimized graph (CPU, default optimizations); ORT's own
    channel-scaling convolutions (``_channel_scaling``) are counted as ``ChannelScale``."""
    import onnx
    import onnxruntime as ort
    with tempfile.TemporaryDirectory() as d:
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.log_severity_level = 3
        so.optimized_model_filepath = os.path.join(d, "optimized.onnx")
        ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        return collections.Counter("ChannelScale" if _channel_scaling(n) else n.op_type
                                   for n in onnx.load(so.optimized_model_filepath).graph.node)


def ort_counts(path: str, threads: int = 1) -> dict[str, int]:
    """int8 and float convolutions and FCs in ONNX Runtime's optimized graph."""
    ops = ort_optimized_ops(path, threads)
    return {"conv_int8": sum(ops[k] for k in ORT_INT8_CONV), "conv_float": sum(ops[k] for k in ORT_FLOAT_CONV),
            "fc_int8": sum(ops[k] for k in ORT_INT8_FC), "fc_float": sum(ops[k] for k in ORT_FLOAT_FC)}
