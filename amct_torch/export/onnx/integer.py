"""Integer form of the quantized convolutions and inner products whose output no later layer
quantizes, so that ONNX Runtime runs every quantized layer with int8 kernels.

Why: ORT turns ``DQ → Conv → Q`` into ``QLinearConv`` (and ``DQ → Gemm → Q`` into ``QGemm``),
but in AMCT's model the output of a convolution that feeds an Eltwise, a graph output or any
layer that is not quantized has no Q: ORT then keeps a float Conv over dequantized tensors
(on a ResNet, 20 of 53 convolutions; on an SSD backbone, every head). The same arithmetic
written with integer operators is ``ConvInteger(q_x, q_w)`` (or ``MatMulInteger``) → int32
accumulator → ``DequantizeLinear`` (× scale_d·scale_w per output channel) → + bias: the fake-quant
model's numbers with the exact integer sum instead of a float one (the two differ by float
rounding only), and no Q added (AMCT's semantics kept). ORT's ``ConvInteger`` takes a scalar
weight zero point, which ARQ's symmetric weights satisfy (0).

The pass rewrites the builder's node list after the graph is written (``rewrite``); a layer
that ORT fuses anyway (its output goes only to a QuantizeLinear, possibly through a ReLU that
the Q's zero point makes redundant) keeps the QDQ form.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Optional

import numpy as np
import onnx
from onnx import helper, numpy_helper


def _inputs(n: onnx.NodeProto) -> list[str]:
    """The values a node reads, those its subgraphs (If branches) read from outside included."""
    out = [i for i in n.input if i]
    for a in n.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            out += [i for sn in a.g.node for i in _inputs(sn)]
    return out


def _index(nodes: list[onnx.NodeProto]) -> tuple[dict, dict]:
    prod, cons = {}, defaultdict(list)
    for n in nodes:
        for o in n.output:
            prod[o] = n
        for i in _inputs(n):
            cons[i].append(n)
    return prod, cons


# value-preserving ops ORT moves a QuantizeLinear across (its QDQ propagation)
_PASS = ("MaxPool", "Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten")


def _fused_by_ort(node: onnx.NodeProto, cons: dict, inits: dict, outputs: set) -> bool:
    """True when ORT's QDQ fusion turns ``node`` into an int8 kernel as it is: its output
    reaches exactly one QuantizeLinear through single-consumer MaxPool/Transpose/Reshape steps
    and at most one ReLU that the Q's zero point (the grid minimum) makes redundant."""
    y, relu = node.output[0], False
    while True:
        users = cons.get(y, [])
        if y in outputs or len(users) != 1:
            return False
        u = users[0]
        if u.op_type == "QuantizeLinear":
            break
        if u.op_type == "Relu" and not relu:
            relu = True
        elif u.op_type not in _PASS:
            return False
        y = u.output[0]
    if not relu:
        return True
    zp = inits.get(u.input[2]) if len(u.input) > 2 else None
    if zp is None:
        return False
    z = numpy_helper.to_array(zp)
    return bool(np.all(z == (0 if z.dtype == np.uint8 else -128)))  # Q(ReLU(x)) == Q(x)


def _attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def rewrite(b, graph_outputs: set) -> int:
    """Rewrite, in builder ``b``, every quantized Conv/Gemm that ORT would leave in float into
    the integer form; returns how many were rewritten."""
    inits = {t.name: t for t in b.inits}
    prod, cons = _index(b.nodes)
    done = 0
    for node in list(b.nodes):
        if node.op_type not in ("Conv", "Gemm"):
            continue
        x_in, w_in = node.input[0], node.input[1]
        flat: Optional[onnx.NodeProto] = None
        xdq = prod.get(x_in)
        if node.op_type == "Gemm" and xdq is not None and xdq.op_type == "Flatten":
            flat, xdq = xdq, prod.get(xdq.input[0])
        wdq = prod.get(w_in)
        if not (xdq is not None and xdq.op_type == "DequantizeLinear" and wdq is not None
                and wdq.op_type == "DequantizeLinear" and wdq.input[0] in inits):
            continue
        if node.op_type == "Gemm" and (_attr(node, "transB", 0) != 1 or _attr(node, "transA", 0)):
            continue
        if _fused_by_ort(node, cons, inits, graph_outputs):
            continue
        _integer(b, node, xdq, wdq, flat, inits, prod)
        done += 1
    if done:
        _prune(b, graph_outputs)
    return done


def _integer(b, node, xdq, wdq, flat, inits: dict, prod: dict) -> None:
    name = node.name.rsplit("_", 1)[0]
    q, x_scale, x_zp = xdq.input[0], xdq.input[1], xdq.input[2]
    w = numpy_helper.to_array(inits[wdq.input[0]])
    s_w = numpy_helper.to_array(inits[wdq.input[1]]).astype(np.float64).reshape(-1)
    s_d = float(numpy_helper.to_array(inits[x_scale]))
    deq = (s_d * s_w).astype(np.float32)  # per output channel, or one value
    new: list[onnx.NodeProto] = []
    conv = node.op_type == "Conv"
    if conv:
        # uint8 weights w + 128 with zero point 128 (the same values): ORT 1.32's ConvInteger
        # runs U8U8 as fast as a float Conv, U8S8 4.7x slower (64ch 3x3 56x56: 3.8 vs 17.9 ms)
        wu = b.init(f"{name}_weight_uint8", (w.astype(np.int16) + 128).astype(np.uint8))
        zero = b.init(f"{name}_w_zero", np.array(128, np.uint8))
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        acc = b.uniq(f"{name}_acc")
        new.append(helper.make_node("ConvInteger", [q, wu, x_zp, zero], [acc],
                                    name=b.uniq(f"{name}_ConvInteger"), **attrs))
        view = (-1, 1, 1)
    else:
        zero = b.init(f"{name}_w_zero", np.array(0, np.int8))
        if flat is not None:
            qf = b.uniq(f"{name}_q_flat")
            new.append(helper.make_node("Flatten", [q], [qf], name=b.uniq(f"{name}_q_Flatten"), axis=1))
            q = qf
        wt = b.init(f"{name}_weight_int8_t", np.ascontiguousarray(w.T))
        acc = b.uniq(f"{name}_acc")
        new.append(helper.make_node("MatMulInteger", [q, wt, x_zp, zero], [acc],
                                    name=b.uniq(f"{name}_MatMulInteger")))
        view = (-1,)
    bias_in = node.input[2] if len(node.input) > 2 and node.input[2] else None
    bdq = prod.get(bias_in) if bias_in else None
    if bdq is not None and bdq.op_type == "DequantizeLinear":  # int32 bias: add it to the sum
        b32 = numpy_helper.to_array(inits[bdq.input[0]]).astype(np.int32).reshape(view)
        summed = b.uniq(f"{name}_acc_bias")
        new.append(helper.make_node("Add", [acc, b.init(f"{name}_bias_int32_v", b32)], [summed],
                                    name=b.uniq(f"{name}_AddInt")))
        acc, bias_in = summed, None
    # int32 → float × scale_d·scale_w in one DequantizeLinear (per output channel on axis 1)
    y = node.output[0] if bias_in is None else b.uniq(f"{name}_scaled")
    dq = b.init(f"{name}_deq_scale", deq.reshape(-1) if deq.size > 1 else deq.reshape(()))
    zp = b.init(f"{name}_acc_zero", np.zeros(deq.size, np.int32) if deq.size > 1 else np.array(0, np.int32))
    new.append(helper.make_node("DequantizeLinear", [acc, dq, zp], [y], name=b.uniq(f"{name}_Dequantize"),
                                **({"axis": 1} if deq.size > 1 else {})))
    if bias_in is not None:
        bias = numpy_helper.to_array(inits[bias_in]).astype(np.float32).reshape(view)
        new.append(helper.make_node("Add", [y, b.init(f"{name}_bias_v", bias)], [node.output[0]],
                                    name=b.uniq(f"{name}_Add")))
    i = list(b.nodes).index(node)
    b.nodes[i:i + 1] = new


def _prune(b, graph_outputs: set) -> None:
    """Drop nodes whose outputs nobody reads (the replaced weight DQs, unused Flattens) and
    initializers no node reads."""
    while True:
        _, cons = _index(b.nodes)
        keep = [n for n in b.nodes if any(o in graph_outputs or cons.get(o) for o in n.output)]
        if len(keep) == len(b.nodes):
            break
        b.nodes[:] = keep
    used = {i for n in b.nodes for i in _inputs(n)}
    b.inits[:] = [t for t in b.inits if t.name in used]
