"""The checks every ONNX model passes before it is written: ``onnx.checker`` (full check, with
strict shape inference) and, when ONNX Runtime is installed, an ``InferenceSession`` created on
it with ORT's default (all) graph optimizations.

Why both: the checker proves the model follows the ONNX standard, but a runtime applies its
own rewrites when it loads a model, and those can refuse a valid model (an int32 zero point
copied into a QuantizeLinear by ORT's QDQ propagation was one). A model written without these
checks could pass the command and fail in the user's deployment; with them a problem is an
``ExportError`` naming the user's model file and, where an ONNX name in the message belongs to
one, the Caffe layer. ``onnxruntime`` is optional: without it only the checker runs, and
``runtime_status`` says so.
"""
from __future__ import annotations

import importlib.util
import logging
import re
from typing import Callable, Optional, Union

import onnx

from amct_torch.errors import ExportError

log = logging.getLogger("amct_torch")

LayerOf = Callable[[str], Optional[str]]
_ORT_PREFIX = re.compile(r"^\[ONNXRuntimeError\]\s*:\s*\d+\s*:\s*\w+\s*:\s*")
_warned: list[bool] = []


def runtime_available() -> bool:
    """True when ``onnxruntime`` can be imported (it is an optional dependency)."""
    return importlib.util.find_spec("onnxruntime") is not None


def runtime_status() -> str:
    """How written models are checked, in words (for summaries and ``inspect``)."""
    if not runtime_available():
        return "onnx.checker only (onnxruntime is not installed)"
    import onnxruntime as ort
    return f"onnx.checker and ONNX Runtime {ort.__version__}"


def _fail(what: str, detail: str, file: Optional[str], layer_of: LayerOf, by: str) -> ExportError:
    detail = _ORT_PREFIX.sub("", " ".join(str(detail).split()))
    layer = layer_of(detail)
    hint = (" (a defect of amct_torch's ONNX writer: please report it; leaving the layer "
            "unquantized or cutting the export before it with --onnx-outputs avoids it)") if layer else \
        " (a defect of amct_torch's ONNX writer: please report it)"
    return ExportError(f"ONNX export: {by} refuses {what}: {detail}{hint}", file=file, layer=layer)


def check_structure(model: Union[onnx.ModelProto, str], file: Optional[str], layer_of: LayerOf,
                    what: str) -> None:
    """``onnx.checker.check_model(full_check=True)`` on a model or a model file's path; an
    ExportError naming ``file`` and the layer otherwise."""
    try:
        onnx.checker.check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as err:
        raise _fail(what, str(err), file, layer_of, "onnx.checker") from None


def check_runtime(data: Union[bytes, str], file: Optional[str], layer_of: LayerOf, what: str) -> bool:
    """Create an ONNX Runtime session (CPU, default optimizations) on the serialised model
    ``data`` (or the model file at that path); an ExportError naming ``file`` and the layer
    when ORT refuses it. Returns False
    (after one warning per process) when onnxruntime is not installed."""
    if not runtime_available():
        if not _warned:
            _warned.append(True)
            log.warning("onnxruntime is not installed: the ONNX models are checked with "
                        "onnx.checker only (pip install onnxruntime to check that a runtime loads them)")
        return False
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.log_severity_level = 3  # errors only: no notes about unused initializers
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    try:
        ort.InferenceSession(data, sess_options=opts, providers=["CPUExecutionProvider"])
    except Exception as err:  # noqa: BLE001 - ORT raises its own exception types for any refusal
        raise _fail(what, str(err), file, layer_of, "ONNX Runtime") from None
    return True
