"""ONNX export: the (fused) float model and its fake-quant model as standard QDQ.

Why a direct builder and not ``torch.onnx.export``: every node of the graph is one Caffe layer,
so mapping layer → ONNX ops is short, needs no tracing, and puts the Q/DQ pairs exactly where
the Caffe fake-quant model has its Quant layers. Each layer is written by the mapping its class
registered (``layers_core``, ``layers`` and the forks' files); symbolic sizes and the output cut
come from ``shapes``; a quantized layer whose output nothing requantizes gets the integer form
(``integer``); the opt-in speed modes add pairs (``residual``, ``eltwise``). The model's layout
(bias, activation types, the speed modes): docs/export.md, "ONNX"."""
from __future__ import annotations

import functools
import operator
import os
from collections.abc import Mapping, Sequence
from typing import Any, Callable, NoReturn, Optional, TypeVar, cast

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import fx

from amct_torch.arguments import checked, graph_module, instance, names_arg, one_of, opt, path_arg
from amct_torch.caffe.layers import CaffeLayer, caffe_pooled_size
from amct_torch.caffe.layers.traits import is_transposed
from amct_torch.errors import ExportError
from amct_torch.export.layer_quant import LayerQuant, plan_layers
from amct_torch.export.onnx import ONNX_ACTIVATIONS, SUFFIXES, layers_core, layers_segmentation  # noqa: F401  (register their mappings)
from amct_torch.export.onnx.eltwise import EltwiseQuant, calibrated_layers, eltwise_plan
from amct_torch.export.onnx.integer import node_inputs, rewrite
from amct_torch.export.onnx.layers import write_layer
from amct_torch.export.onnx.ort_float import dequantized_grouped_deconv, grouped_deconv_row_scales
from amct_torch.export.onnx.shapes import Probe, pick_outputs, probe
from amct_torch.export.onnx.stream import skeleton, streamable, write_model
from amct_torch.export.onnx.targets import apply as apply_target
from amct_torch.export.onnx.targets import check_records as check_target_records
from amct_torch.export.onnx.targets import check_speed, get_target
from amct_torch.export.onnx.validate import check_runtime, check_structure
from amct_torch.files.atomic import atomic_write_bytes, remove_quietly, staged_files, temp_beside
from amct_torch.files.direct_io import DirectFile
from amct_torch.record import LayerRecord

OPSET = 17
LIGHT_ELEMENTS = 1024  # the preflight writes arrays larger than this as shape-only inputs
_MAX, _AVE = 0, 1
_SUM, _PROD = 1, 0


class _Builder:
    """Collects nodes and initializers; one instance per written model."""

    def __init__(self, gm: fx.GraphModule, plan: Mapping[str, LayerQuant], activations: str,
                 file: Optional[str], bias: str = "float",
                 out_factors: Optional[Mapping[str, tuple[float, int]]] = None,
                 eltwise: Optional[Mapping[str, EltwiseQuant]] = None,
                 elt_factors: Optional[Mapping[str, tuple[float, int]]] = None,
                 light: bool = False, stream: bool = False) -> None:
        self.gm, self.plan, self.act, self.file = gm, plan, activations, file
        self.bias_form = bias
        self.out_factors = dict(out_factors or {})
        self.eltwise = dict(eltwise or {})
        self.elt_factors = dict(elt_factors or {})
        self.dq_factors: dict[str, tuple[float, int]] = {}
        self.nodes: list[onnx.NodeProto] = []
        # every initializer's value by name (views of the weights, not copies); the TensorProtos
        # are made once the graph is final (``tensors``), for the values still used
        self.arrays: dict[str, np.ndarray] = {}
        self.light = light
        # ``stream`` (export_onnx): large initializers are written from their arrays
        # (``onnx_stream``), the model holding their name, type and dims only
        self.stream = stream
        self.streamed: dict[str, np.ndarray] = {}
        self.names: set[str] = set()
        self.owner: dict[str, str] = {}  # ONNX name -> the Caffe layer it was written for
        self.current: Optional[str] = None
        self.qcache: dict[tuple, str] = {}
        self.constants: dict[str, np.ndarray] = {}  # folded values (PriorBox) by ONNX name
        self.static_layers: list[str] = []  # layers that fixed the spatial size as constants
        self.static_batch: list[str] = []  # layers that fixed the batch size

    def fold(self, mod: CaffeLayer, xs: list[str]) -> str:
        """A layer whose inputs are all constants, computed here and written as a constant."""
        with torch.no_grad():
            y = mod(*[torch.from_numpy(self.constants[x]) for x in xs])
        arr = y.detach().cpu().float().numpy()
        name = self.init(f"{mod.caffe_name}_folded", arr)
        self.constants[name] = arr
        return name

    def static(self, mod: CaffeLayer, batch: bool = False) -> None:
        """Record that ``mod``'s mapping wrote a spatial (or batch) size as a constant."""
        (self.static_batch if batch else self.static_layers).append(mod.caffe_name)

    def uniq(self, base: str) -> str:
        out, i = base, 1
        while out in self.names:
            i += 1
            out = f"{base}_{i}"
        self.names.add(out)
        if self.current is not None:
            self.owner[out] = self.current
        return out

    def init(self, base: str, arr: np.ndarray) -> str:
        name = self.uniq(base)
        self.arrays[name] = np.asarray(arr)
        return name

    def tensors(self) -> tuple[list[onnx.TensorProto], list[onnx.ValueInfoProto]]:
        """The initializers, and (``light``: the preflight) the large ones as graph inputs of
        their shape and type instead: the graph is checked without serialising the weights."""
        inits, shapes = [], []
        used = {i for n in self.nodes for i in node_inputs(n)}
        for name, arr in self.arrays.items():
            if name not in used:  # replaced (integer form) or folded (priors): not written
                continue
            if self.light and arr.size > LIGHT_ELEMENTS:
                shapes.append(helper.make_tensor_value_info(
                    name, helper.np_dtype_to_tensor_dtype(arr.dtype), list(arr.shape)))
            elif self.stream and streamable(arr):
                inits.append(skeleton(arr, name))
                self.streamed[name] = arr
            else:
                inits.append(numpy_helper.from_array(arr, name))
        return inits, shapes

    def layer_of(self, text: str) -> Optional[str]:
        """The Caffe layer whose ONNX names occur in ``text`` (the longest name found wins)."""
        best = max((n for n in self.owner if n in text), key=len, default=None)
        return None if best is None else self.owner[best]

    def node(self, op: str, inputs: list[str], base: str, n_out: int = 1, **attrs) -> list[str]:
        outs = [self.uniq(base if n_out == 1 else f"{base}_{k}") for k in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=self.uniq(f"{base}_{op}"), **attrs))
        return outs

    def fail(self, mod: CaffeLayer, msg: str) -> NoReturn:
        raise ExportError(f"ONNX export: {msg}", file=self.file or getattr(mod, "_file", None),
                          layer=mod.caffe_name)

    # -- quantization ------------------------------------------------------------------
    def quant_act(self, x: str, lq: LayerQuant) -> str:
        return self.qdq(x, lq.name, "in", lq.scale_d, lq.offset_d)

    def qdq(self, x: str, name: str, where: str, scale_d: float, offset_d: int) -> str:
        """``QuantizeLinear → DequantizeLinear`` (the fake quantization) on ``x`` (one pair per value and
        factors), named ``{name}_{where}_q`` / ``_dq``."""
        key = (x, float(scale_d), int(offset_d))
        if key in self.qcache:
            return self.qcache[key]
        if self.dq_factors.get(x) == key[1:]:  # already the DQ output of these very factors
            return x
        zp = np.array(offset_d + 128, np.uint8) if self.act == "uint8" else np.array(offset_d, np.int8)
        s = self.init(f"{name}_{where}_scale", np.array(scale_d, np.float32))
        z = self.init(f"{name}_{where}_zero_point", zp)
        q = self.node("QuantizeLinear", [x, s, z], f"{name}_{where}_q")[0]
        dq = self.node("DequantizeLinear", [q, s, z], f"{name}_{where}_dq")[0]
        self.qcache[key] = dq
        self.dq_factors[dq] = key[1:]
        return dq

    def quant_weight(self, lq: LayerQuant, w_int8: Optional[np.ndarray], axis: int,
                     scales: Optional[np.ndarray] = None) -> str:
        scale_w = lq.scale_w
        assert w_int8 is not None and scale_w is not None  # the entry of a weighted layer
        qw = self.init(f"{lq.name}_weight_int8", np.asarray(w_int8, np.int8))
        if lq.per_channel:
            sw = scale_w if scales is None else scales  # scales: laid along ``axis`` already
            s = self.init(f"{lq.name}_weight_scale", sw.astype(np.float32))
            z = self.init(f"{lq.name}_weight_zero_point", np.zeros(sw.size, np.int8))
            return self.node("DequantizeLinear", [qw, s, z], f"{lq.name}_weight", axis=axis)[0]
        s = self.init(f"{lq.name}_weight_scale", np.array(scale_w[0], np.float32))
        z = self.init(f"{lq.name}_weight_zero_point", np.array(0, np.int8))
        return self.node("DequantizeLinear", [qw, s, z], f"{lq.name}_weight")[0]

    def quant_bias(self, lq: LayerQuant) -> str:
        bias, deq_scale = lq.bias, lq.deq_scale
        if self.bias_form == "float":
            assert bias is not None  # the entry of a layer with a bias
            return self.init(f"{lq.name}_bias", bias.astype(np.float32))
        assert deq_scale is not None  # the entry of a weighted layer
        qb = self.init(f"{lq.name}_bias_int32", np.asarray(lq.bias_int32, np.int32))
        s = self.init(f"{lq.name}_bias_scale", deq_scale.astype(np.float32))
        z = self.init(f"{lq.name}_bias_zero_point", np.zeros(deq_scale.size, np.int32))
        return self.node("DequantizeLinear", [qb, s, z], f"{lq.name}_bias", axis=0)[0]

    # -- layers ------------------------------------------------------------------------
    def layer(self, mod: CaffeLayer, xs: list[str], in_shapes: list, lq: Optional[LayerQuant],
              out_shapes: Sequence = ()) -> list[str]:
        """The layer's outputs, written by its class's mapping behind its input Q/DQ pairs."""
        if lq is not None:
            n_q = len(xs) if lq.joint else 1
            xs = [self.quant_act(x, lq) for x in xs[:n_q]] + xs[n_q:]
        outs = write_layer(self, mod, xs, in_shapes, list(out_shapes))
        if outs is None:
            self.fail(mod, f"layer type {mod.caffe_type} (with these parameters) has no ONNX mapping here")
        return outs

    def affine(self, mod, x: str, shape, gamma, beta) -> str:
        view = [-1] + [1] * (len(shape) - 2)
        g = self.init(f"{mod.caffe_name}_gamma", gamma.detach().cpu().float().reshape(view).numpy())
        y = self.node("Mul", [x, g], f"{mod.caffe_name}_mul")[0]
        if beta is None:
            return y
        b = self.init(f"{mod.caffe_name}_beta", beta.detach().cpu().float().reshape(view).numpy())
        return self.node("Add", [y, b], mod.caffe_name)[0]

    def conv(self, mod, x: str, lq: Optional[LayerQuant]) -> str:
        deconv = is_transposed(mod)
        ins = [x] + self._weight_and_bias(mod, lq, axis=1 if deconv else 0,
                                          grouped_deconv=deconv and mod.groups > 1)
        (ph, pw), kernel = mod.padding, list(mod.kernel_size)
        return self.node("ConvTranspose" if deconv else "Conv", ins, mod.caffe_name,
                         kernel_shape=kernel, strides=list(mod.stride), pads=[ph, pw, ph, pw],
                         dilations=list(mod.dilation), group=int(mod.groups))[0]

    def fc(self, mod, x: str, shape, lq: Optional[LayerQuant]) -> str:
        # the module keeps W as (N, K) whatever ``transpose`` says, so Gemm(transB=1) fits both
        ax = mod.axis % len(shape)
        if ax != 1:
            if lq is not None:
                self.fail(mod, "a quantized InnerProduct must have axis 1")
            shp = self.init(f"{mod.caffe_name}_shape", np.array([0] * ax + [-1], np.int64))
            x = self.node("Reshape", [x, shp], f"{mod.caffe_name}_flatten")[0]
            w = self.init(f"{mod.caffe_name}_weight_t", mod.weight.detach().cpu().float().numpy().T.copy())
            y = self.node("MatMul", [x, w], f"{mod.caffe_name}_matmul" if mod.bias is not None else mod.caffe_name)[0]
            if mod.bias is None:
                return y
            bias = self.init(f"{mod.caffe_name}_bias", mod.bias.detach().cpu().float().numpy())
            return self.node("Add", [y, bias], mod.caffe_name)[0]
        if len(shape) != 2:
            x = self.node("Flatten", [x], f"{mod.caffe_name}_flatten", axis=1)[0]
            if lq is not None and self.eltwise:
                # speed mode: the same Q/DQ again after the Flatten (Q(DQ(q)) = q, no new
                # rounding) so that ORT sees DQ → Gemm and can fuse QGemm
                x = self.qdq(x, mod.caffe_name, "flat", lq.scale_d, lq.offset_d)
        ins = [x] + self._weight_and_bias(mod, lq, axis=0)
        return self.node("Gemm", ins, mod.caffe_name, transB=1)[0]

    def _weight_and_bias(self, mod, lq: Optional[LayerQuant], axis: int,
                         grouped_deconv: bool = False) -> list:
        """The weight (DequantizeLinear of int8 along ``axis`` when quantized, else float) and
        the bias inputs (if any) of a Conv/ConvTranspose/Gemm node. A per-channel grouped
        Deconvolution: its scales along axis 0, or its dequantized weights (``ort_float.py``)."""
        if lq is None:
            ins = [self.init(f"{mod.caffe_name}_weight", mod.weight.detach().cpu().float().numpy())]
        elif grouped_deconv and lq.per_channel:
            w8, sw = lq.int8_weight, lq.scale_w
            assert w8 is not None and sw is not None  # the entry of a weighted layer
            rows = grouped_deconv_row_scales(sw, tuple(w8.shape), int(mod.groups))
            ins = [self.quant_weight(lq, w8, axis=0, scales=rows) if rows is not None else
                   self.init(f"{mod.caffe_name}_weight",  # no single axis: the same numbers in float
                             dequantized_grouped_deconv(w8, sw, int(mod.groups)))]
        else:
            ins = [self.quant_weight(lq, lq.int8_weight, axis=axis)]
        if mod.bias is not None:
            ins.append(self.quant_bias(lq) if lq is not None else
                       self.init(f"{mod.caffe_name}_bias", mod.bias.detach().cpu().float().numpy()))
        return ins

    def pool(self, mod, x: str, shape) -> str:
        if mod.method not in (_MAX, _AVE):
            self.fail(mod, "STOCHASTIC pooling has no ONNX mapping")
        if mod.global_pooling:
            return self.node("GlobalMaxPool" if mod.method == _MAX else "GlobalAveragePool", [x],
                             mod.caffe_name)[0]
        (kh, kw), (sh, sw), (ph, pw) = mod.kernel_size, mod.stride, mod.padding
        if ph == 0 and pw == 0:
            # without padding Caffe's ceil/floor output size and divisor are ONNX's ceil_mode
            # with count_include_pad 0: valid at any input size
            kw_: dict[str, Any] = dict(kernel_shape=[kh, kw], strides=[sh, sw], ceil_mode=int(mod.ceil))
            if mod.method == _MAX:
                return self.node("MaxPool", [x], mod.caffe_name, **kw_)[0]
            return self.node("AveragePool", [x], mod.caffe_name, count_include_pad=0, **kw_)[0]
        self.static(mod)
        h, w = int(shape[-2]), int(shape[-1])
        oh, ow = (caffe_pooled_size(h, kh, sh, ph, mod.ceil), caffe_pooled_size(w, kw, sw, pw, mod.ceil))
        eh, ew = max(0, (oh - 1) * sh + kh - h - ph), max(0, (ow - 1) * sw + kw - w - pw)
        if mod.method == _MAX:
            return self.node("MaxPool", [x], mod.caffe_name, kernel_shape=[kh, kw], strides=[sh, sw],
                             pads=[ph, pw, eh, ew])[0]
        if ph == 0 and pw == 0 and eh == 0 and ew == 0:
            return self.node("AveragePool", [x], mod.caffe_name, kernel_shape=[kh, kw],
                             strides=[sh, sw])[0]
        # Caffe's divisor counts the zero padding but not the ceil overhang beyond H + pad:
        # pad with zeros explicitly, then average without counting the (remaining) overhang.
        if ph or pw:
            pads = self.init(f"{mod.caffe_name}_pads", np.array([0, 0, ph, pw, 0, 0, ph, pw], np.int64))
            x = self.node("Pad", [x, pads], f"{mod.caffe_name}_pad")[0]
        eh2, ew2 = max(0, eh - ph), max(0, ew - pw)
        return self.node("AveragePool", [x], mod.caffe_name, kernel_shape=[kh, kw], strides=[sh, sw],
                         pads=[0, 0, eh2, ew2], count_include_pad=0)[0]

    def quant_eltwise(self, mod, xs: list[str], eq: EltwiseQuant) -> str:
        """Speed mode: Q/DQ on the inputs and output as ``onnx_eltwise`` decided."""
        def quantized(x: str, spec: tuple[str, object]) -> str:
            kind, p = spec
            if kind == "consumer":
                assert isinstance(p, tuple)  # a Factor
                return self.qdq(x, p[0], "in", p[1], p[2])
            if kind == "calib":
                assert isinstance(p, str)  # the layer whose output was calibrated
                return self.qdq(x, p, "out", *self.elt_factors[p])
            return x
        y = self.eltwise_node(mod, [quantized(x, sp) for x, sp in zip(xs, eq.inputs)] + xs[len(eq.inputs):])
        return quantized(y, eq.output)

    def eltwise_node(self, mod, xs: list[str]) -> str:
        name = mod.caffe_name
        if mod.operation == _SUM:
            terms = list(xs)
            if mod.coeff is not None:
                terms = [self.node("Mul", [x, self.init(f"{name}_coeff{k}", np.array(c, np.float32))],
                                   f"{name}_mul{k}")[0] for k, (x, c) in enumerate(zip(xs, mod.coeff))]
            op = "Add"
        else:
            terms, op = list(xs), ("Mul" if mod.operation == _PROD else "Max")
        y = terms[0]
        for k, t in enumerate(terms[1:]):
            y = self.node(op, [y, t], name if k == len(terms) - 2 else f"{name}_{k}")[0]
        return y


def _shape_of(pr: Probe, node: fx.Node) -> tuple:
    """The (first) output shape of ``node`` at the declared size."""
    return tuple(pr.out(node)[0])


def _dims(shape: tuple, varying: set, batch_name: str, prefix: str) -> list:
    return [(batch_name if i == 0 else f"{prefix}_d{i}") if i in varying else int(d)
            for i, d in enumerate(shape)]


def _build(gm: fx.GraphModule, plan: Mapping[str, LayerQuant], activations: str,
           file: Optional[str], graph_name: str, bias: str = "float",
           out_factors: Optional[Mapping[str, tuple[float, int]]] = None,
           eltwise: Optional[Mapping[str, EltwiseQuant]] = None,
           elt_factors: Optional[Mapping[str, tuple[float, int]]] = None,
           outputs: Optional[Sequence[str]] = None, dynamic_spatial: Optional[bool] = None,
           probed: Optional[Probe] = None, integer_ops: bool = True,
           light: bool = False, stream: bool = False) -> tuple[onnx.ModelProto, _Builder]:
    """One ONNX model of ``gm`` (float when ``plan`` is empty) and the builder that wrote it
    (its ``layer_of`` maps an ONNX name back to a Caffe layer). The batch is symbolic; the
    spatial size too when ``dynamic_spatial`` (None: when the net allows it, see
    ``onnx_shapes``), otherwise the declared size is fixed. ``light`` (the preflight): large
    initializers become shape-only graph inputs. The model passes ``onnx.checker``'s full
    check (an ExportError naming ``file`` and the layer otherwise). ``stream``: large
    initializers hold no data (``_Builder.streamed`` has their arrays); the check is then
    left to ``_write_checked``, on the file written."""
    pr = probed or probe(gm, try_spatial=dynamic_spatial is not False)
    want_spatial = pr.spatial and dynamic_spatial is not False
    model, b = _walk(pr, plan, activations, file, graph_name, bias, out_factors, eltwise,
                     elt_factors, outputs, want_spatial, integer_ops, light, stream)
    if want_spatial and b.static_layers:
        if dynamic_spatial:
            raise ExportError(f"ONNX export: the net has a fixed spatial size (layer "
                              f"'{b.static_layers[0]}' needs it as a constant)", file=file)
        model, b = _walk(pr, plan, activations, file, graph_name, bias, out_factors, eltwise,
                         elt_factors, outputs, False, integer_ops, light, stream)
    if not stream:
        check_structure(model, file, b.layer_of, f"the {graph_name} ONNX model")
    return model, b


def _walk(pr: Probe, plan, activations, file, graph_name, bias, out_factors, eltwise, elt_factors,
          outputs, spatial: bool, integer_ops: bool = True,
          light: bool = False, stream: bool = False) -> tuple[onnx.ModelProto, _Builder]:
    cpu = pr.gm
    chosen, needed = pick_outputs(cpu, outputs, file)
    b = _Builder(cpu, plan, activations, file, bias, out_factors, eltwise, elt_factors, light, stream)
    # the graph outputs carry the blob names: reserved, so no inner value takes them (an
    # in-place last layer writes under its bottom's name)
    inputs = {n.meta.get("caffe_blob", n.name) for n in cpu.graph.nodes if n.op == "placeholder"}
    b.names.update(k for k in chosen if k not in inputs)

    value: dict[fx.Node, str] = {}
    g_inputs = []
    for node in cpu.graph.nodes:
        if node.op == "placeholder":
            name = b.uniq(node.meta.get("caffe_blob", node.name))
            value[node] = name
            shape = tuple(pr.out(node)[0])
            dims = ["N"] + [("H" if i == 2 else "W") if spatial and len(shape) == 4 and i >= 2 else int(d)
                            for i, d in enumerate(shape) if i > 0]
            g_inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, dims))
        elif node not in needed:
            continue
        elif node.op == "call_module":
            mod = cpu.get_submodule(node.target)
            if not isinstance(mod, CaffeLayer):
                raise ExportError(f"graph node '{node.name}' is not a Caffe layer", file=file)
            shapes = [_shape_of(pr, a) for a in node.args]
            ins = [value[a] for a in node.args]
            b.current = mod.caffe_name
            if ins and all(isinstance(x, str) and x in b.constants for x in ins):
                value[node] = b.fold(mod, ins)  # e.g. the Concat of folded priors
                b.current = None
                continue
            outs = b.layer(mod, [value[a] for a in node.args], shapes, plan.get(mod.caffe_name),
                           pr.out(node))
            b.current = None
            value[node] = outs[0] if len(outs) == 1 else outs  # type: ignore[assignment]
        elif node.op == "call_function" and node.target is operator.getitem:
            value[node] = value[node.args[0]][node.args[1]]
        elif node.op != "output":
            raise ExportError(f"graph node '{node.name}' ({node.op}) cannot be exported", file=file)
    out_infos = []
    for key, v in chosen.items():
        src, name = value[v], key
        if src != key:
            b.nodes.append(helper.make_node("Identity", [src], [key], name=b.uniq(f"{key}_output")))
        shape = _shape_of(pr, v)
        out_infos.append(helper.make_tensor_value_info(name, TensorProto.FLOAT,
                                                       _dims(shape, pr.dims(v, 0, spatial), "N", name)))
    if plan and integer_ops:
        rewrite(b, {o.name for o in out_infos})
    inits, weight_inputs = b.tensors()
    graph = helper.make_graph(b.nodes, graph_name, g_inputs + weight_inputs, out_infos, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="amct_torch")
    model.ir_version = min(model.ir_version, 8)
    return model, b


_F = TypeVar("_F", bound=Callable[..., Any])  # not ParamSpec: typing has it from Python 3.10


def _float_staged_removed_on_error(fn: _F) -> _F:
    """``fn`` (``export_onnx``) that removes the temporary file of its ``float_staged`` when it
    raises, wherever it raises: the caller handed that file on."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except BaseException:
            staged = kwargs.get("float_staged")
            if isinstance(staged, tuple):
                remove_quietly(staged[0])
            raise
    return cast(_F, wrapper)


@checked(graph=graph_module, records=instance(Mapping, what="a mapping of layer name to LayerRecord"),
         path_prefix=path_arg, activations=one_of("int8", "uint8"), file=opt(path_arg),
         outputs=opt(names_arg))
@_float_staged_removed_on_error
def export_onnx(graph: fx.GraphModule, records: Mapping[str, LayerRecord], path_prefix: str, *,
                activations: str = "uint8", bias: str = "float",
                quantize_residual_outputs: bool = False, quantize_eltwise: bool = False,
                calibration_data=None, file: Optional[str] = None,
                outputs: Optional[Sequence[str]] = None,
                dynamic_spatial: Optional[bool] = None, integer_ops: bool = True,
                model_file: Optional[str] = None, target: str = "onnxruntime",
                float_graph: Optional[fx.GraphModule] = None,
                float_staged: Optional[tuple[str, str]] = None) -> tuple[str, str]:
    """Write ``{path_prefix}_float.onnx`` (the float graph as given, e.g. BN-fused) and
    ``{path_prefix}_quant.onnx`` (QDQ fake-quant of ``records``). Returns both paths.

    ``activations``: "uint8" (default; zero point offset_d + 128: the same values as int8,
    and the form ORT fuses into QLinearConv most often) or "int8" (zero point offset_d).
    ``bias``: "float" (the fake-quant model's bias; ORT quantizes it for its int8 kernels) or
    "int32" (round(b/(scale_d·scale_w)) behind DequantizeLinear).
    ``quantize_residual_outputs`` (opt-in, departs from AMCT: one more rounding per residual
    branch): Q/DQ after quantized layers that feed an Eltwise, factors from min/max of
    ``calibration_data`` (an N×C×H×W array or an iterable of them) in the torch fake-quant
    model. ``quantize_eltwise`` (opt-in speed mode, departs from AMCT; implies
    ``quantize_residual_outputs``): Q/DQ on the inputs and output of every Eltwise SUM without a
    joint-quant entry, so that ONNX Runtime runs QLinearAdd and stays in int8 between blocks
    (factors chosen by ``onnx_eltwise``: a consumer's own Quant where there is one, otherwise
    min/max on ``calibration_data``). ``outputs``: blob names to cut the net at (default: the
    net's outputs). ``dynamic_spatial``: None (symbolic H/W when the net runs at other sizes and
    no mapping needs them as constants), True (required) or False. The batch is always
    symbolic. ``integer_ops`` (default): a quantized Conv/InnerProduct whose output no later
    layer quantizes is written as ConvInteger/MatMulInteger → int32 → × scale_d·scale_w (+ bias)
    (``onnx_integer``), so that ORT runs every quantized layer with int8 kernels; False keeps
    the plain QDQ form there (the speed mode ``quantize_eltwise`` keeps its own form). Opset 17.
    Before anything is written both models pass ``onnx.checker`` (full check) and load in ONNX
    Runtime (when installed; ``onnx_validate``); a refusal is an ExportError naming
    ``model_file`` (default ``file``: the file errors about the graph name) and the layer, and
    neither file is written. ``target``: the runtime the QDQ model is laid out for
    ("onnxruntime", the default, is this form; "openvino" and "tensorrt" fix ``activations``
    and ``integer_ops`` and rewrite the model, ``onnx_targets``). ``float_graph``: the graph
    to write as ``_float.onnx`` when it is not ``graph`` (e.g. the user's float model when
    ``graph`` was changed by an improvement); None: ``graph``. ``float_staged``: the float
    model already written and checked (``float_ahead.FloatAhead``): its (temporary, final)
    pair, put in place with the quant model (a ``streamed`` target only)."""
    activations, integer_ops = get_target(target).layout(activations, integer_ops)
    if activations not in ONNX_ACTIVATIONS:
        raise ValueError(f"activations must be one of {', '.join(ONNX_ACTIVATIONS)}, got {activations!r}")
    if bias not in ("float", "int32"):
        raise ValueError(f"bias must be 'float' or 'int32', got {bias!r}")
    plan = plan_layers(graph, records, file, fake=False)  # the int8 weights are what it writes
    check_speed(target, quantize_residual_outputs or quantize_eltwise,
                "quantize_residual_outputs / quantize_eltwise", ValueError)
    check_target_records(target, ((n, lq.offset_d) for n, lq in plan.items()), file)
    out_factors, eplan, elt_factors = None, None, None
    if quantize_residual_outputs or quantize_eltwise:
        if calibration_data is None:
            raise ValueError("quantize_residual_outputs / quantize_eltwise need calibration_data")
        from amct_torch.export.caffe.fakequant import fake_quant_graph
        from amct_torch.export.onnx.residual import residual_layers, residual_output_factors
        res = residual_layers(graph, plan)
        eplan = eltwise_plan(graph, plan, set(res)) if quantize_eltwise else {}
        extra = calibrated_layers(eplan)
        factors = residual_output_factors(fake_quant_graph(graph, records, file), res + extra,
                                          calibration_data, file)
        out_factors = {n: factors[n] for n in res}
        elt_factors = {n: factors[n] for n in extra}
    float_path, quant_path = path_prefix + SUFFIXES["onnx_float"], path_prefix + SUFFIXES["onnx"]
    pr = probe(graph, try_spatial=dynamic_spatial is not False)
    if float_graph is None:
        float_graph = graph
    named = model_file if model_file is not None else file
    # the ONNX Runtime layout is written from the arrays, one model at a time (the targets'
    # rewrites read initializer values: built whole)
    stream = get_target(target).streamed
    if float_staged is not None and (not stream or float_staged[1] != float_path):
        raise ValueError(f"float_staged: a model staged for {float_path} and a streamed target only")
    quant = _build(graph, plan, activations, named, "quant", bias, out_factors, eplan, elt_factors,
                   outputs=outputs, dynamic_spatial=dynamic_spatial, probed=pr,
                   integer_ops=integer_ops and not quantize_eltwise, stream=stream)
    if get_target(target).rewritten:
        check_structure(apply_target(target, quant[0]), named, quant[1].layer_of, "the quant ONNX model")
    if stream:
        del plan
        with staged_files() as staged:  # both checked before either is renamed; a SIGTERM removes them
            if float_staged is not None:
                staged.append(float_staged)
            staged.append(_stage_checked(quant, quant_path, named))
            del quant
            if float_staged is not None:
                return float_path, quant_path
            # another float graph is probed by _build (graph's probe, a CPU copy of a GPU
            # graph, released first)
            float_pr = pr if float_graph is graph else None
            del pr
            float_model = _build(float_graph, {}, activations, named, "float", outputs=outputs,
                                 dynamic_spatial=dynamic_spatial, probed=float_pr, stream=True)
            staged.insert(0, _stage_checked(float_model, float_path, named))
            del float_model
        return float_path, quant_path
    models = [(_build(float_graph, {}, activations, named, "float", outputs=outputs,
                      dynamic_spatial=dynamic_spatial, probed=pr if float_graph is graph else None),
               float_path), (quant, quant_path)]
    _write_checked(models, named)
    return float_path, quant_path


def _stage_checked(built: tuple, path: str, file: Optional[str]) -> tuple[str, str]:
    """Write a streamed model (``_build(stream=True)``) to a temporary file beside ``path``,
    run the checks of ``_build`` and ``_write_checked`` on that file (``onnx.checker``'s full
    check, ONNX Runtime's load), and return (temporary, final) path for ``atomic.staged_files``; the
    temporary file is removed on a refusal. The model's proto and arrays are released by the
    caller."""
    model, b = built
    fd, tmp = temp_beside(path)
    try:
        with DirectFile(fd) as f:  # around the page cache (amct_torch.files.direct_io)
            write_model(f, model, b.streamed)
        what = os.path.basename(path)
        check_structure(tmp, file, b.layer_of, f"the model {what}")
        check_runtime(tmp, file, b.layer_of, f"the model {what}")
    except BaseException:
        remove_quietly(tmp)
        raise
    return tmp, path


def _write_checked(models: list, file: Optional[str]) -> None:
    """Serialise each (model, builder) pair, have ONNX Runtime load it, and only when every
    one loads write them (each atomically)."""
    blobs = []
    for (model, b), path in models:
        data = model.SerializeToString()
        check_runtime(data, file, b.layer_of, f"the model {os.path.basename(path)}")
        blobs.append((data, path))
    for data, path in blobs:
        atomic_write_bytes(path, data)


def export_float_onnx(graph: fx.GraphModule, path: str, *, outputs: Optional[Sequence[str]] = None,
                      dynamic_spatial: Optional[bool] = None, file: Optional[str] = None) -> str:
    """Write only the float model of ``graph`` to ``path`` (atomically); same options as
    ``export_onnx``. Returns ``path``."""
    built = _build(graph, {}, "int8", file, "float", outputs=outputs, dynamic_spatial=dynamic_spatial)
    _write_checked([(built, path)], file)
    return path
