"""What a runtime actually runs: the convolutions and fully-connected layers of a compiled model
with the precision the runtime chose, read from the runtime itself (OpenVINO's compiled runtime
model; ONNX Runtime's optimized graph), so that a test or benchmark counts int8 kernels
independently of how the exporter meant the graph; and the one way the tests open and run an
ONNX model in ONNX Runtime (``ort_session``, ``ort_run``), the independent implementation the
exported models are checked against."""
from __future__ import annotations

import collections
import os
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any, Optional, Union

import numpy as np

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


#: a model ONNX Runtime can open: a file path, the serialized bytes, or an ``onnx.ModelProto``
OrtModel = Union[str, "os.PathLike[str]", bytes, Any]


def ort_session(model: OrtModel, level: str = "ENABLE_ALL", threads: int = 1,
                optimized_path: Optional[str] = None):
    """An ONNX Runtime CPU session of ``model``, its warnings silenced. ``level`` names ORT's
    graph optimization level without the ``ORT_`` prefix: "ENABLE_ALL" (ORT's default, what a
    deployment runs: Q/DQ pairs fused into int8 kernels) or "DISABLE_ALL" (the model computed
    node by node as written, so only float rounding separates it from a reference).
    ``optimized_path``: where ORT writes the graph it optimized (what it actually runs)."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, f"ORT_{level}")
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    if optimized_path is not None:
        so.optimized_model_filepath = str(optimized_path)
    if not isinstance(model, (str, bytes, os.PathLike)):
        model = model.SerializeToString()
    elif isinstance(model, os.PathLike):
        model = os.fspath(model)
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def ort_run(model: OrtModel, feeds: Union[np.ndarray, Mapping[str, np.ndarray]], level: str = "ENABLE_ALL",
            outputs: Optional[Sequence[str]] = None, threads: int = 1) -> dict[str, np.ndarray]:
    """``model``'s outputs (all, or ``outputs``) by name, computed by ONNX Runtime (session as
    in ``ort_session``). ``feeds``: arrays by input name, or one array for the first input;
    passed as contiguous float32 (every input of a Caffe net is a float blob)."""
    sess = ort_session(model, level, threads)
    if not isinstance(feeds, Mapping):
        feeds = {sess.get_inputs()[0].name: feeds}
    names = list(outputs) if outputs is not None else [o.name for o in sess.get_outputs()]
    res = sess.run(names, {k: np.ascontiguousarray(v, np.float32) for k, v in feeds.items()})
    return dict(zip(names, res))


def ort_optimized_model(model: OrtModel, threads: int = 1):
    """The graph ONNX Runtime runs for ``model`` (CPU, default optimizations) as an
    ``onnx.ModelProto``."""
    import onnx
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "optimized.onnx")
        ort_session(model, threads=threads, optimized_path=path)
        return onnx.load(path)


def ort_optimized_ops(path: OrtModel, threads: int = 1) -> collections.Counter:
    """Op counts of ONNX Runtime's optimized graph (CPU, default optimizations); ORT's own
    channel-scaling convolutions (``_channel_scaling``) are counted as ``ChannelScale``."""
    return collections.Counter("ChannelScale" if _channel_scaling(n) else n.op_type
                               for n in ort_optimized_model(path, threads).graph.node)


def ort_counts(path: OrtModel, threads: int = 1) -> dict[str, int]:
    """int8 and float convolutions and FCs in ONNX Runtime's optimized graph."""
    ops = ort_optimized_ops(path, threads)
    return {"conv_int8": sum(ops[k] for k in ORT_INT8_CONV), "conv_float": sum(ops[k] for k in ORT_FLOAT_CONV),
            "fc_int8": sum(ops[k] for k in ORT_INT8_FC), "fc_float": sum(ops[k] for k in ORT_FLOAT_FC)}
