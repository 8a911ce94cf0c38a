"""Integer form of the quantized convolutions and inner products whose output no later layer
quantizes, so that ONNX Runtime runs every quantized layer with int8 kernels.

Why: ORT fuses ``DQ → Conv → Q`` into ``QLinearConv``, but a convolution feeding an Eltwise, a net
output or an unquantized layer has no Q in AMCT's model, and ORT keeps it a float Conv (20 of 53
on a ResNet). ``ConvInteger``/``MatMulInteger`` → ``Cast`` → ``Mul`` by scale_d·scale_w → + bias is
the same arithmetic with an exact integer sum and no Q added; not an int32 ``DequantizeLinear``,
which ORT's QDQ passes copy into a QuantizeLinear it then refuses. ``rewrite`` applies the form
after the graph is written; layers ORT fuses anyway keep the QDQ form, except an inner product fed
through a Flatten, which ORT leaves a float Gemm even then. docs/export.md."""
from __future__ import annotations

from collections import defaultdict
from typing import Optional

import numpy as np
import onnx
from onnx import helper


def node_inputs(n: onnx.NodeProto) -> list[str]:
    """The values a node reads, those its subgraphs (If branches) read from outside included."""
    out = [i for i in n.input if i]
    for a in n.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            out += [i for sn in a.g.node for i in node_inputs(sn)]
    return out


def _index(nodes: list[onnx.NodeProto]) -> tuple[dict, dict]:
    prod, cons = {}, defaultdict(list)
    for n in nodes:
        for o in n.output:
            prod[o] = n
        for i in node_inputs(n):
            cons[i].append(n)
    return prod, cons


# value-preserving ops ORT moves a QuantizeLinear across (its QDQ propagation)
_PASS = ("MaxPool", "Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten")


def _fused_by_ort(node: onnx.NodeProto, cons: dict, arrays: dict, outputs: set) -> bool:
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
    z = arrays.get(u.input[2]) if len(u.input) > 2 else None
    if z is None:
        return False
    return bool(np.all(z == (0 if z.dtype == np.uint8 else -128)))  # Q(ReLU(x)) == Q(x)


def _shifted(w: np.ndarray, light: bool) -> np.ndarray:
    """int8 weights as uint8 w + 128 (zero point 128); the preflight's placeholder as is."""
    if light:
        return np.broadcast_to(np.uint8(128), w.shape)
    return (w.astype(np.int16) + 128).astype(np.uint8)


def _transposed(w: np.ndarray, rows: int = 64) -> np.ndarray:
    """``w.T`` as a new C-ordered array, copied ``rows`` rows of ``w`` at a time: a whole-matrix
    transposing copy walks the destination a byte per cache line (VGG-16's fc6, 4096 x 25088
    int8: 0.35 s against 0.15 s in bands)."""
    if w.ndim != 2:
        return np.ascontiguousarray(w.T)
    out = np.empty(w.shape[::-1], dtype=w.dtype)
    for i in range(0, w.shape[0], rows):
        out[:, i:i + rows] = w[i:i + rows].T
    return out


def _attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def rewrite(b, graph_outputs: set) -> int:
    """Rewrite, in builder ``b``, every quantized Conv/Gemm that ORT would leave in float into
    the integer form; returns how many were rewritten."""
    arrays = b.arrays
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
                and wdq.op_type == "DequantizeLinear" and wdq.input[0] in arrays):
            continue
        if node.op_type == "Gemm" and (_attr(node, "transB", 0) != 1 or _attr(node, "transA", 0)):
            continue
        if flat is None and _fused_by_ort(node, cons, arrays, graph_outputs):
            continue  # ORT fuses DQ → Gemm → Q into QGemm, but not across the Flatten
        b.current = b.owner.get(node.name)
        _integer(b, node, xdq, wdq, flat, arrays, prod)
        b.current = None
        done += 1
    if done:
        _prune(b, graph_outputs)
        _pool_first(b, graph_outputs)
    return done


def _monotone(n: onnx.NodeProto, arrays: dict) -> bool:
    """True when ``n`` is an element-wise function of its first input that never decreases
    (a ≤ b ⇒ f(a) ≤ f(b), float rounding included: correctly rounded + and × by a positive
    constant are monotone), so that max(f(x_i)) = f(max(x_i)) exactly."""
    def const(k: int) -> Optional[np.ndarray]:
        return arrays.get(n.input[k]) if len(n.input) > k else None
    if n.op_type == "Relu":
        return True
    if n.op_type == "LeakyRelu":
        return float(_attr(n, "alpha", 0.01)) >= 0
    if n.op_type in ("Mul", "PRelu"):
        c = const(1)
        return c is not None and c.size > 0 and bool(np.all(c > 0 if n.op_type == "Mul" else c >= 0))
    if n.op_type == "Add":
        return const(1) is not None
    return False


def _pool_first(b, graph_outputs: set) -> int:
    """Move each MaxPool that follows an integer-form layer through monotone element-wise ops
    (its × scale_d·scale_w, + bias, a PReLU with slopes ≥ 0, ReLU) to right after the layer's
    int32 → float Cast. Returns how many moved.

    Why: a MaxPool between such a chain and the next QuantizeLinear is what ORT's QDQ
    propagation copies a Q/DQ pair across, after which it runs the MaxPool on uint8 codes in
    NCHW (a convolution kernel in NCHW follows: ConvInteger), a generic kernel 20-100× slower
    than its float one (ORT 1.32: 8×32×46×46, 3×3 stride 2: 23 ms vs 0.2 ms); on a PReLU face
    net that made the int8 model 2-3× slower than the float one. Pooling first leaves a
    PReLU/ReLU in front of the Q, which ORT does not propagate across, so the MaxPool runs in
    float, and the rescale and the activation run on the pooled (smaller) tensor. The numbers
    are the same bit for bit: max commutes with every non-decreasing function."""
    arrays = b.arrays
    moved = 0
    for pool in [n for n in b.nodes if n.op_type == "MaxPool" and len(n.output) == 1]:
        prod, cons = _index(b.nodes)
        chain: list[onnx.NodeProto] = []
        x = pool.input[0]
        while True:
            p = prod.get(x)
            if p is None or x in graph_outputs or len(cons.get(x, [])) != 1:
                chain = []
                break
            if p.op_type == "Cast":
                src = prod.get(p.input[0])
                integer = src is not None and (src.op_type == "ConvInteger" or (
                    src.op_type == "Add" and prod.get(src.input[0]) is not None
                    and prod[src.input[0]].op_type == "ConvInteger"))
                chain = chain + [p] if integer else []
                break
            if not _monotone(p, arrays):
                chain = []
                break
            chain.append(p)
            x = p.input[0]
        if len(chain) < 2:  # nothing between the Cast and the MaxPool: already first
            continue
        cast, after_cast, last = chain[-1], chain[-2], chain[0]
        pooled = b.uniq(f"{cast.output[0]}_pooled")
        pool.input[0], pool.output[0], y = cast.output[0], pooled, pool.output[0]
        for k, v in enumerate(after_cast.input):
            if v == cast.output[0]:
                after_cast.input[k] = pooled
        last.output[0] = y
        b.nodes.remove(pool)
        b.nodes.insert(b.nodes.index(cast) + 1, pool)
        moved += 1
    return moved


def _integer(b, node, xdq, wdq, flat, arrays: dict, prod: dict) -> None:
    name = node.name.rsplit("_", 1)[0]
    q, x_scale, x_zp = xdq.input[0], xdq.input[1], xdq.input[2]
    w = arrays[wdq.input[0]]
    s_w = arrays[wdq.input[1]].astype(np.float64).reshape(-1)
    s_d = float(arrays[x_scale])
    deq = (s_d * s_w).astype(np.float32)  # per output channel, or one value
    new: list[onnx.NodeProto] = []
    conv = node.op_type == "Conv"
    if conv:
        # uint8 weights w + 128 with zero point 128 (the same values): ORT 1.32's ConvInteger
        # runs U8U8 as fast as a float Conv, U8S8 4.7x slower (64ch 3x3 56x56: 3.8 vs 17.9 ms)
        wu = b.init(f"{name}_weight_uint8", _shifted(w, b.light))
        zero = b.init(f"{name}_w_zero", np.array(128, np.uint8))
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        acc = b.uniq(f"{name}_acc")
        new.append(helper.make_node("ConvInteger", [q, wu, x_zp, zero], [acc],
                                    name=b.uniq(f"{name}_ConvInteger"), **attrs))
        view: tuple[int, ...] = (-1, 1, 1)
    else:
        zero = b.init(f"{name}_w_zero", np.array(0, np.int8))
        if flat is not None:
            qf = b.uniq(f"{name}_q_flat")
            new.append(helper.make_node("Flatten", [q], [qf], name=b.uniq(f"{name}_q_Flatten"), axis=1))
            q = qf
        wt = b.init(f"{name}_weight_int8_t", np.broadcast_to(np.int8(0), w.T.shape) if b.light
                    else _transposed(w))
        acc = b.uniq(f"{name}_acc")
        new.append(helper.make_node("MatMulInteger", [q, wt, x_zp, zero], [acc],
                                    name=b.uniq(f"{name}_MatMulInteger")))
        view = (-1,)
    bias_in = node.input[2] if len(node.input) > 2 and node.input[2] else None
    bdq = prod.get(bias_in) if bias_in else None
    if bdq is not None and bdq.op_type == "DequantizeLinear":  # int32 bias: add it to the sum
        b32 = arrays[bdq.input[0]].astype(np.int32).reshape(view)
        summed = b.uniq(f"{name}_acc_bias")
        new.append(helper.make_node("Add", [acc, b.init(f"{name}_bias_int32_v", b32)], [summed],
                                    name=b.uniq(f"{name}_AddInt")))
        acc, bias_in = summed, None
    # int32 → float × scale_d·scale_w per output channel (axis 1): DequantizeLinear's own
    # arithmetic, written so that no QDQ pass of a runtime touches it
    accf = b.uniq(f"{name}_acc_float")
    new.append(helper.make_node("Cast", [acc], [accf], name=b.uniq(f"{name}_Cast"), to=onnx.TensorProto.FLOAT))
    y = node.output[0] if bias_in is None else b.uniq(f"{name}_scaled")
    dq = b.init(f"{name}_deq_scale", deq.reshape(view) if deq.size > 1 else deq.reshape(()))
    new.append(helper.make_node("Mul", [accf, dq], [y], name=b.uniq(f"{name}_Rescale")))
    if bias_in is not None:
        bias = arrays[bias_in].astype(np.float32).reshape(view)
        new.append(helper.make_node("Add", [y, b.init(f"{name}_bias_v", bias)], [node.output[0]],
                                    name=b.uniq(f"{name}_Add")))
    i = list(b.nodes).index(node)
    b.nodes[i:i + 1] = new


def _prune(b, graph_outputs: set) -> None:
    """Drop nodes whose outputs nobody reads (the replaced weight DQs, unused Flattens); the
    builder writes only the initializers still read."""
    while True:
        _, cons = _index(b.nodes)
        keep = [n for n in b.nodes if any(o in graph_outputs or cons.get(o) for o in n.output)]
        if len(keep) == len(b.nodes):
            break
        b.nodes[:] = keep

