"""ONNX mappings of the Caffe layers beyond the quantizable core: shape layers, element-wise
layers, normalisations, ArgMax, PriorBox (constant-folded) and DetectionOutput (``detection``).

Why a separate file: ``qdq`` places the Q/DQ nodes; this file only knows how one Caffe layer is
written with standard ONNX ops (opset 17) with Caffe's semantics (the torch modules are the
reference, OpenCV's Caffe importer checks both). Every mapping keeps the batch axis symbolic; one
that needs a spatial size as a constant calls ``b.static(...)`` so that the exporter falls back to
a fixed spatial size. The table of mappings: docs/caffe_format.md, "Supported layer types"."""
from __future__ import annotations

from typing import Callable, Optional, Union

import numpy as np
import torch

from amct_torch.caffe.layers import CaffeLayer, layer_class

Shape = tuple

#: layer class -> its ONNX writer ``fn(builder, module, inputs, in_shapes, out_shapes)``
_MAPPINGS: dict[type[CaffeLayer], Callable] = {}


def mapping(*layers: Union[str, type[CaffeLayer]]) -> Callable:
    """Register the ONNX writer of the given layer classes (or their type strings). One writer
    per class; a subclass without its own uses its base class's (the depthwise convolutions)."""
    def deco(fn: Callable) -> Callable:
        for key in layers:
            cls = layer_class(key) if isinstance(key, str) else key
            if cls is None or cls in _MAPPINGS:
                raise ValueError(f"ONNX mapping of {key!r}: {'unknown type' if cls is None else 'mapped twice'}")
            _MAPPINGS[cls] = fn
        return fn
    return deco


def mapping_of(cls: type[CaffeLayer]) -> Optional[Callable]:
    """The ONNX writer of a layer class (its own or its nearest base class's), or None."""
    for base in cls.__mro__:
        if base in _MAPPINGS:
            return _MAPPINGS[base]
    return None


def write_layer(b, mod: CaffeLayer, xs: list[str], in_shapes: list, out_shapes: list) -> Optional[list[str]]:
    """The output names of ``mod`` written into builder ``b``, or None when its writer does not
    take these parameters; a type declared without an ONNX form is refused with its reason."""
    cls = type(mod)
    if cls.no_onnx_form:
        b.fail(mod, f"layer type {mod.caffe_type} has no ONNX form: {cls.no_onnx_form}")
    fn = mapping_of(cls)
    return None if fn is None else fn(b, mod, xs, [tuple(s) for s in in_shapes], out_shapes)


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().float().numpy()


def _const(b, name: str, value, dtype=np.float32) -> str:
    return b.init(name, np.asarray(value, dtype))


def _channel_view(b, mod, arr: np.ndarray, rank: int, what: str) -> str:
    """A per-channel array shaped (C, 1, ...) to broadcast over axis 1 of a rank-``rank`` input."""
    return _const(b, f"{mod.caffe_name}_{what}", arr.reshape((-1,) + (1,) * (rank - 2)))


# -- element-wise -----------------------------------------------------------------------------
@mapping("PReLU")
def _prelu(b, mod, xs, ins, outs):
    w = _np(mod.weight)
    slope = _const(b, f"{mod.caffe_name}_slope", w.reshape(1)) if mod.channel_shared \
        else _channel_view(b, mod, w, len(ins[0]), "slope")
    return b.node("PRelu", [xs[0], slope], mod.caffe_name)


@mapping("ELU")
def _elu(b, mod, xs, ins, outs):
    return b.node("Elu", xs, mod.caffe_name, alpha=mod.alpha)


@mapping("BNLL")
def _bnll(b, mod, xs, ins, outs):
    return b.node("Softplus", xs, mod.caffe_name)


def _scale_shift(b, mod, x: str, scale: float, shift: float) -> str:
    if scale != 1.0:
        x = b.node("Mul", [x, _const(b, f"{mod.caffe_name}_scale", scale)], f"{mod.caffe_name}_mul")[0]
    if shift != 0.0:
        x = b.node("Add", [x, _const(b, f"{mod.caffe_name}_shift", shift)], f"{mod.caffe_name}_add")[0]
    return x


@mapping("Power")
def _power(b, mod, xs, ins, outs):
    y = _scale_shift(b, mod, xs[0], mod.scale, mod.shift)
    if mod.power != 1.0:
        y = b.node("Pow", [y, _const(b, f"{mod.caffe_name}_power", mod.power)], mod.caffe_name)[0]
    elif y == xs[0]:
        y = b.node("Identity", [y], mod.caffe_name)[0]
    return [y]


@mapping("Exp")
def _exp(b, mod, xs, ins, outs):
    return b.node("Exp", [_scale_shift(b, mod, xs[0], mod.in_scale, mod.in_shift)], mod.caffe_name)


@mapping("Log")
def _log(b, mod, xs, ins, outs):
    y = b.node("Log", [_scale_shift(b, mod, xs[0], mod.scale, mod.shift)], f"{mod.caffe_name}_ln")[0]
    if mod.inv_ln != 1.0:
        y = b.node("Mul", [y, _const(b, f"{mod.caffe_name}_inv_ln", mod.inv_ln)], mod.caffe_name)[0]
    return [y]


@mapping("Threshold")
def _threshold(b, mod, xs, ins, outs):
    gt = b.node("Greater", [xs[0], _const(b, f"{mod.caffe_name}_threshold", mod.threshold)],
                f"{mod.caffe_name}_gt")[0]
    return b.node("Cast", [gt], mod.caffe_name, to=1)


@mapping("Clip")
def _clip(b, mod, xs, ins, outs):
    lo, hi = _const(b, f"{mod.caffe_name}_min", mod.min), _const(b, f"{mod.caffe_name}_max", mod.max)
    return b.node("Clip", [xs[0], lo, hi], mod.caffe_name)


@mapping("Swish")
def _swish(b, mod, xs, ins, outs):
    z = xs[0] if mod.beta == 1.0 else b.node(
        "Mul", [xs[0], _const(b, f"{mod.caffe_name}_beta", mod.beta)], f"{mod.caffe_name}_bx")[0]
    s = b.node("Sigmoid", [z], f"{mod.caffe_name}_sigmoid")[0]
    return b.node("Mul", [xs[0], s], mod.caffe_name)


@mapping("Split")
def _split(b, mod, xs, ins, outs):
    return [xs[0]] * mod.num_tops


@mapping("Silence")
def _silence(b, mod, xs, ins, outs):
    return []


# -- shape layers -----------------------------------------------------------------------------
def _reshape(b, mod, x: str, target: list[int], name: Optional[str] = None) -> str:
    shape = _const(b, f"{mod.caffe_name}_shape", target, np.int64)
    return b.node("Reshape", [x, shape], name or mod.caffe_name)[0]


def _tail(b, mod, in_shape: Shape, start: int) -> list[int]:
    """Input dims from ``start`` on, as constants (which fixes the spatial size if any)."""
    tail = [int(d) for d in in_shape[start:]]
    if any(i >= 2 for i in range(start, len(in_shape))):
        b.static(mod)
    return tail


@mapping("Flatten")
def _flatten(b, mod, xs, ins, outs):
    nd = len(ins[0])
    a, e = mod.axis % nd, mod.end_axis % nd
    if e == nd - 1 and a >= 1:
        return b.node("Flatten", xs, mod.caffe_name, axis=a) if a == 1 and nd >= 2 else \
            [_reshape(b, mod, xs[0], [0] * a + [-1])]
    if a == 0:  # the batch is merged: the merged dim is the inferred one
        return [_reshape(b, mod, xs[0], [-1] + _tail(b, mod, ins[0], e + 1))]
    return [_reshape(b, mod, xs[0], [0] * a + [-1] + _tail(b, mod, ins[0], e + 1))]


@mapping("Reshape")
def _reshape_layer(b, mod, xs, ins, outs):
    nd = len(ins[0])
    start = mod.axis if mod.axis >= 0 else nd + mod.axis + 1
    end = nd if mod.num_axes == -1 else start + mod.num_axes
    dims = list(mod.dims)
    # Caffe's 0 copies the input dim at position start + i; ONNX's 0 copies the dim at the same
    # output position, which is that very dim because the prefix keeps its length.
    tail = [0] * (nd - end) if len(dims) == end - start else _tail(b, mod, ins[0], end)
    if start == 0 and dims and dims[0] not in (0, -1):
        b.static(mod, batch=True)
    return [_reshape(b, mod, xs[0], [0] * start + dims + tail)]


@mapping("Permute")
def _permute(b, mod, xs, ins, outs):
    nd = len(ins[0])
    order = list(mod.order) + [i for i in range(nd) if i not in mod.order]
    return b.node("Transpose", xs, mod.caffe_name, perm=order)


@mapping("Slice")
def _slice(b, mod, xs, ins, outs):
    ax = mod.axis % len(ins[0])
    if mod.num_tops == 1:
        return b.node("Identity", xs, mod.caffe_name)
    if not mod.points:  # equal parts: valid at any size
        return b.node("Split", [xs[0]], mod.caffe_name, n_out=mod.num_tops, axis=ax)
    sizes = [int(o[ax]) for o in outs]
    if ax >= 2:
        b.static(mod)
    split = _const(b, f"{mod.caffe_name}_split", sizes, np.int64)
    return b.node("Split", [xs[0], split], mod.caffe_name, n_out=mod.num_tops, axis=ax)


@mapping("Crop")
def _crop(b, mod, xs, ins, outs):
    nd = len(ins[0])
    ax = mod.axis % nd
    n = nd - ax
    offs = mod.offsets * n if len(mod.offsets) == 1 else (mod.offsets or [0] * n)
    name = mod.caffe_name
    shape = b.node("Shape", [xs[1]], f"{name}_ref_shape", start=ax)[0]
    starts = _const(b, f"{name}_starts", offs, np.int64)
    ends = b.node("Add", [shape, starts], f"{name}_ends")[0]
    axes = _const(b, f"{name}_axes", list(range(ax, nd)), np.int64)
    return b.node("Slice", [xs[0], starts, ends, axes], name)


@mapping("ArgMax")
def _argmax(b, mod, xs, ins, outs):
    name, nd = mod.caffe_name, len(ins[0])
    k = _const(b, f"{name}_k", [mod.top_k], np.int64)
    if mod.axis is not None:
        vals, idx = b.node("TopK", [xs[0], k], f"{name}_topk", n_out=2, axis=mod.axis % nd)
        return b.node("Identity", [vals], name) if mod.out_max_val else b.node("Cast", [idx], name, to=1)
    flat = _reshape(b, mod, xs[0], [0, -1], f"{name}_flat")
    vals, idx = b.node("TopK", [flat, k], f"{name}_topk", n_out=2, axis=1)
    fidx = b.node("Cast", [idx], f"{name}_idx", to=1)[0]
    one = _const(b, f"{name}_axis1", [1], np.int64)
    y = b.node("Unsqueeze", [fidx, one], f"{name}_u")[0]
    if mod.out_max_val:
        v = b.node("Unsqueeze", [vals, one], f"{name}_uv")[0]
        y = b.node("Concat", [y, v], f"{name}_cat", axis=1)[0]
    if nd > 3:
        rest = _const(b, f"{name}_rest", list(range(3, nd)), np.int64)
        return b.node("Unsqueeze", [y, rest], name)
    return b.node("Identity", [y], name)


# -- normalisation / affine ------------------------------------------------------------------
@mapping("Normalize")
def _normalize(b, mod, xs, ins, outs):
    name, nd = mod.caffe_name, len(ins[0])
    axes = list(range(1, nd)) if mod.across_spatial else [1]
    ss = b.node("ReduceSumSquare", xs, f"{name}_sumsq", axes=axes, keepdims=1)[0]
    ss = b.node("Add", [ss, _const(b, f"{name}_eps", mod.eps)], f"{name}_sumsq_eps")[0]
    norm = b.node("Sqrt", [ss], f"{name}_norm")[0]
    y = b.node("Div", [xs[0], norm], f"{name}_div")[0]
    w = _np(mod.weight)
    scale = _const(b, f"{name}_scale", w.reshape(1)) if mod.channel_shared \
        else _channel_view(b, mod, w, nd, "scale")
    return b.node("Mul", [y, scale], name)


@mapping("LRN")
def _lrn(b, mod, xs, ins, outs):
    name = mod.caffe_name
    if not mod.within:
        return b.node("LRN", xs, name, size=mod.size, alpha=mod.alpha, beta=mod.beta, bias=mod.k)
    if mod.size % 2 == 0:
        b.fail(mod, "LRN WITHIN_CHANNEL with an even local_size has no ONNX mapping here")
    p = (mod.size - 1) // 2
    sq = b.node("Mul", [xs[0], xs[0]], f"{name}_sq")[0]
    pads = _const(b, f"{name}_pads", [0, 0, p, p, 0, 0, p, p], np.int64)
    sq = b.node("Pad", [sq, pads], f"{name}_pad")[0]
    avg = b.node("AveragePool", [sq], f"{name}_avg", kernel_shape=[mod.size] * 2, strides=[1, 1])[0]
    t = b.node("Mul", [avg, _const(b, f"{name}_alpha", mod.alpha)], f"{name}_a")[0]
    t = b.node("Add", [t, _const(b, f"{name}_one", 1.0)], f"{name}_1a")[0]
    t = b.node("Pow", [t, _const(b, f"{name}_nbeta", -mod.beta)], f"{name}_pow")[0]
    return b.node("Mul", [xs[0], t], name)


def _axis_view(b, mod, param: str, p_rank: int, x_rank: int, axis: int, base: str) -> str:
    """``param`` (rank ``p_rank``, spanning input axes [axis, axis + p_rank)) unsqueezed to
    broadcast against a rank-``x_rank`` input."""
    ax = axis % x_rank
    extra = list(range(ax)) + list(range(ax + p_rank, x_rank))
    if not extra:
        return param
    axes = _const(b, f"{base}_axes", extra, np.int64)
    return b.node("Unsqueeze", [param, axes], f"{base}_view")[0]


def _param_input(b, mod, t: torch.Tensor, x_shape: Shape, what: str) -> tuple[str, int]:
    """A flat Scale/Bias parameter reshaped to the input axes it spans (as Caffe views it)."""
    nd = len(x_shape)
    ax = mod.axis % nd
    p_nd = mod.num_axes if mod.num_axes != -1 else nd - ax
    shape = tuple(int(d) for d in x_shape[ax:ax + p_nd])
    if p_nd and any(i + ax >= 2 for i in range(p_nd)) and int(np.prod(shape)) > 1:
        b.static(mod)
    arr = _np(t).reshape(shape if p_nd else ())
    return _const(b, f"{mod.caffe_name}_{what}", arr), p_nd


@mapping("Bias")
def scale_bias(b, mod, xs, ins, outs):
    name, nd = mod.caffe_name, len(ins[0])
    is_scale = mod.caffe_type == "Scale"
    if len(xs) == 2:  # the second bottom is the parameter
        p = _axis_view(b, mod, xs[1], len(ins[1]), nd, mod.axis, f"{name}_p")
        y = b.node("Mul" if is_scale else "Add", [xs[0], p], name if not (is_scale and mod.bias is not None)
                   else f"{name}_mul")[0]
        if is_scale and mod.bias is not None:
            bias, p_nd = _param_input(b, mod, mod.bias, ins[0], "beta")
            y = b.node("Add", [y, _axis_view(b, mod, bias, p_nd, nd, mod.axis, f"{name}_b")], name)[0]
        return [y]
    if not is_scale:
        bias, p_nd = _param_input(b, mod, mod.bias, ins[0], "bias")
        return b.node("Add", [xs[0], _axis_view(b, mod, bias, p_nd, nd, mod.axis, f"{name}_b")], name)
    g, p_nd = _param_input(b, mod, mod.weight, ins[0], "gamma")
    y = b.node("Mul", [xs[0], _axis_view(b, mod, g, p_nd, nd, mod.axis, f"{name}_g")],
               name if mod.bias is None else f"{name}_mul")[0]
    if mod.bias is not None:
        bias, _ = _param_input(b, mod, mod.bias, ins[0], "beta")
        y = b.node("Add", [y, _axis_view(b, mod, bias, p_nd, nd, mod.axis, f"{name}_b")], name)[0]
    return [y]


def batchnorm_batch_stats(b, mod, xs, ins, outs):
    """BatchNorm with ``use_global_stats: false`` (the global-stats case is an affine in
    ``onnx_qdq``): the batch's own mean and variance, as Caffe computes them at test time."""
    name, nd = mod.caffe_name, len(ins[0])
    axes = [0] + list(range(2, nd))
    mean = b.node("ReduceMean", xs, f"{name}_mean", axes=axes, keepdims=1)[0]
    d = b.node("Sub", [xs[0], mean], f"{name}_centred")[0]
    var = b.node("ReduceMean", [b.node("Mul", [d, d], f"{name}_sq")[0]], f"{name}_var", axes=axes, keepdims=1)[0]
    var = b.node("Add", [var, _const(b, f"{name}_eps", mod.eps)], f"{name}_var_eps")[0]
    return b.node("Div", [d, b.node("Sqrt", [var], f"{name}_std")[0]], name)


# -- SSD ------------------------------------------------------------------------------------
@mapping("PriorBox")
def _prior_box(b, mod, xs, ins, outs):
    """Constant-folded: the priors depend only on the feature map's and the image's sizes."""
    b.static(mod)
    with torch.no_grad():
        pri = mod(torch.zeros(ins[0]), torch.zeros(ins[1]))
    name = b.init(f"{mod.caffe_name}_priors", pri.cpu().float().numpy())
    b.constants[name] = pri.cpu().float().numpy()
    return [name]


@mapping("DetectionOutput")
def _detection_output(b, mod, xs, ins, outs):
    from amct_torch.export.onnx.detection import write_detection_output
    return [write_detection_output(b, mod, xs)]


# -- AMCT's own layers (a loaded fake-quant model) ------------------------------------------
@mapping("Quant")
def _quant(b, mod, xs, ins, outs):
    """The file's Quant (round(x·scale) + offset, scale = 1/scale_d) as QuantizeLinear with
    y_scale = 1/scale → DequantizeLinear (uint8, zero point offset + 128): the same grid; a value
    within float rounding of a .5 boundary may round the other way. A deploy model's integer
    layers have no ONNX mapping here (export the fake-quant model, or the float model + record)."""
    if getattr(mod, "emit_codes", False):
        b.fail(mod, "the deploy model's integer layers are not exported to ONNX; export the float "
                    "model with its record (calibrate/convert --onnx) or the fake-quant model")
    s = _const(b, f"{mod.caffe_name}_scale", np.float32(1.0 / mod.scale))
    z = _const(b, f"{mod.caffe_name}_zero_point", mod.offset + 128, np.uint8)
    q = b.node("QuantizeLinear", [xs[0], s, z], f"{mod.caffe_name}_q")[0]
    return b.node("DequantizeLinear", [q, s, z], mod.caffe_name)


@mapping("DeQuant")
def _dequant(b, mod, xs, ins, outs):
    if getattr(mod, "deq_scale", None) is not None:
        b.fail(mod, "the deploy model's integer layers are not exported to ONNX")
    return b.node("Identity", xs, mod.caffe_name)

