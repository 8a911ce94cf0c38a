"""ONNX QDQ export: ONNX Runtime (CPU) computes our torch fake-quant model, layer by layer and on
nsfw's logits, with its graph optimizer off (Q/DQ as float ops) and on (int8 kernels).

Why two kinds of check. A quantized ResNet is chaotic under rounding: a float-rounding
difference flips the odd value that sits on a rounding boundary of some Quant, one step there
grows into flips downstream, and after 53 quantizers two correct implementations of one model
end up about as far apart as the model is from float. The test shows this on the torch model
itself (float32 vs float64 arithmetic). So the exact claim is checked *layer-locally*: ORT's
int8 codes at every QuantizeLinear are exposed, torch's Quant layers are fed ORT's codes
(teacher forcing), and torch's own code for each element must equal ORT's except where torch's
value sits within a rounding tolerance of a .5 boundary; the logits computed from ORT's codes
must equal ORT's logits to float rounding. End to end the logits are checked with an SQNR bound
tied to that chaos scale, plus top-1.
"""
from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from amct_torch.caffe.graph import layer_modules, load_caffe
from amct_torch.caffe.layers import QuantLayer
from amct_torch.export import export_onnx, fake_quant_graph
from amct_torch.export.layer_quant import plan_layers
from amct_torch.fusion import fuse_bn
from helpers.caffe_nets import make_net
from helpers.data import natural_images_bgr
from helpers.exports import SMALL_BODY, minmax_records, small_blobs, sqnr_db
from helpers.runtimes import ort_optimized_ops, ort_run, ort_session

INT8_KERNELS = {"QLinearConv", "ConvInteger", "QLinearMatMul", "MatMulInteger", "QGemm",
                "MatMulIntegerToFloat", "QLinearAveragePool"}
LOGITS = "fc_nsfw"
# float32 rounding of one layer's output, relative to the largest |value| of the tensor:
# a dot product of n ≤ 4608 terms accumulated in float32 in a different order errs by about
# sqrt(n)·2^-24 ≈ 4e-6 of Σ|x·w|; 2e-5 leaves a factor ~5.
FLOAT_RTOL = 2e-5


@pytest.fixture(scope="module")
def nsfw(nsfw_model):
    gm = fuse_bn(load_caffe(*nsfw_model)).graph
    recs = minmax_records(gm, torch.from_numpy(natural_images_bgr(count=4, seed=1)))
    return gm, recs, fake_quant_graph(gm, recs), natural_images_bgr(count=4, seed=3)


@pytest.fixture(scope="module")
def exported(nsfw, tmp_path_factory):
    """The default export with int8 and with uint8 activations: {activations: (float, quant)}."""
    gm, recs, _, _ = nsfw
    d = tmp_path_factory.mktemp("onnx")
    # the plain QDQ form everywhere (integer_ops=False): these tests are about Q/DQ placement
    # and ORT's QDQ fusion; the integer form has its own tests (test_export_onnx_int8.py)
    return {a: export_onnx(gm, recs, str(d / a), activations=a, integer_ops=False) for a in ("int8", "uint8")}


def torch_logits(model, x: np.ndarray, dtype=torch.float32) -> np.ndarray:
    got = []
    h = layer_modules(model)[LOGITS].register_forward_hook(lambda m, a, o: got.append(o.double().numpy()))
    with torch.no_grad():
        model(torch.from_numpy(x).to(dtype))
    h.remove()
    return got[0]


def with_observers(qp: str) -> tuple[onnx.ModelProto, dict[str, str]]:
    """The QDQ model plus, for every QuantizeLinear, an int32 copy of its codes and the logits
    as graph outputs. (Cast consumers, not the Q outputs themselves: a Q output that is a graph
    output stops ORT from fusing it.) Returns the model and {Q output: observer output}."""
    m = onnx.load(qp)
    obs = {}
    for n in [n for n in m.graph.node if n.op_type == "QuantizeLinear"]:
        o = n.output[0] + "_codes"
        m.graph.node.append(helper.make_node("Cast", [n.output[0]], [o], to=TensorProto.INT32))
        m.graph.output.append(helper.make_tensor_value_info(o, TensorProto.INT32, None))
        obs[n.output[0]] = o
    m.graph.output.append(helper.make_tensor_value_info(LOGITS, TensorProto.FLOAT, None))
    return m, obs


def test_structure_and_float_model(nsfw, exported):
    gm, recs, fq, x = nsfw
    fp, qp = exported["int8"]
    for p in (fp, qp):
        m = onnx.load(p)
        onnx.checker.check_model(m, full_check=True)
        assert m.opset_import[0].version >= 13
    qm = onnx.load(qp)
    ops = collections.Counter(n.op_type for n in qm.graph.node)
    # exactly the torch model's quantizers: one Q (and its DQ) per Quant layer, no others
    n_quant = sum(isinstance(m, QuantLayer) for m in layer_modules(fq).values())
    assert ops["QuantizeLinear"] == n_quant
    axes = [a.i for n in qm.graph.node if n.op_type == "DequantizeLinear" for a in n.attribute
            if a.name == "axis"]
    assert len(axes) == sum(r.scale_w is not None and len(r.scale_w) > 1 for r in recs.values())
    with torch.no_grad():
        flt = gm(torch.from_numpy(x))["prob"].numpy()
    got_f = ort_session(fp, "ENABLE_ALL").run(None, {"data": x})[0]
    np.testing.assert_allclose(got_f, flt, atol=1e-5)


def test_int32_bias_form(tmp_path, nsfw):
    """bias="int32": the bias initializer is round(b/(scale_d·scale_w)) behind a
    DequantizeLinear with scale float32(scale_d)·scale_w, computed here from the record."""
    gm, recs, _, _ = nsfw
    _, qp = export_onnx(gm, recs, str(tmp_path / "m"), bias="int32", integer_ops=False)
    inits = {i.name: numpy_helper.to_array(i) for i in onnx.load(qp).graph.initializer}
    mods = layer_modules(gm)
    for name in ("conv_1", "conv_stage3_block2_branch2c", LOGITS):
        r = recs[name]
        sw = np.broadcast_to(np.asarray(r.scale_w, np.float32), inits[f"{name}_bias_int32"].shape)
        step = np.float64(np.float32(r.scale_d)) * sw.astype(np.float64)
        want = np.rint(mods[name].bias.detach().double().numpy() / step)
        np.testing.assert_array_equal(inits[f"{name}_bias_int32"], want)
        np.testing.assert_allclose(inits[f"{name}_bias_scale"], (np.float32(r.scale_d) * sw), rtol=1e-7)


@pytest.mark.parametrize("activations,level", [("int8", "DISABLE_ALL"), ("uint8", "ENABLE_ALL")])
def test_layer_local_equality(tmp_path, nsfw, exported, activations, level):
    """Teacher forcing (see the module docstring). Optimizations off: only float rounding
    separates ORT from torch, so a code may differ only for values within 1e-3 of a step from a
    .5 boundary. Int8 kernels (uint8 activations: ORT fuses Q/DQ with observers attached only
    in that form): ORT requantizes the exact int32 accumulator with a float multiplier and
    quantizes the bias itself (error ≤ ½·scale_d·scale_w); at each quantizer that shifts the
    value by at most ``bias_steps`` steps (computed from the record), so codes differ by at
    most one step, and only within bias_steps + 1e-3 of a boundary."""
    gm, recs, fq, x = nsfw
    _, qp = exported[activations]
    m, obs = with_observers(qp)
    sess = ort_session(m, level, optimized_path=str(tmp_path / "opt.onnx"))
    names = [o.name for o in sess.get_outputs()]
    res = dict(zip(names, sess.run(None, {"data": x})))
    if level == "ENABLE_ALL":
        ops = collections.Counter(n.op_type for n in onnx.load(str(tmp_path / "opt.onnx")).graph.node)
        assert ops["QLinearConv"] >= 30, ops
    plan = plan_layers(gm, recs)
    min_step = min(lq.scale_d for lq in plan.values())
    bias_abs = max(0.5 * lq.scale_d * float(lq.scale_w.max()) for lq in plan.values() if lq.weighted)
    tol = 1e-3 + (bias_abs / min_step if level == "ENABLE_ALL" else 0.0)
    zp_shift = 128 if activations == "uint8" else 0
    mods, stats, hooks = layer_modules(fq), {}, []
    for name, mod in mods.items():
        if not isinstance(mod, QuantLayer):
            continue
        code = res[obs[name[:-len("_quant_layer")] + "_in_q"]].astype(np.int64) - zp_shift

        def hook(mod, inp, out, code=code, name=name):
            v = (inp[0].double() / mod.scale_d).numpy()
            mine = np.clip(np.rint(v) + mod.offset, -128, 127).astype(np.int64)
            diff = mine - code
            near = np.abs(np.abs(v - np.floor(v)) - 0.5)  # distance of x/scale from a .5 boundary
            stats[name] = (int(np.abs(diff).max()), float(near[diff != 0].max(initial=0.0)),
                           float((diff != 0).mean()))
            return torch.from_numpy(((code - mod.offset) * np.float32(mod.scale_d)).astype(np.float32))
        hooks.append(mod.register_forward_hook(hook))
    try:
        forced = torch_logits(fq, x)
    finally:
        for h in hooks:
            h.remove()
    assert len(stats) == len(obs)
    assert max(s[0] for s in stats.values()) <= 1, stats
    worst = max(stats.items(), key=lambda kv: kv[1][1])
    assert worst[1][1] <= tol, (worst, tol)
    assert max(s[2] for s in stats.values()) <= 2 * tol + 1e-4
    fc = plan[LOGITS]
    atol = FLOAT_RTOL * np.abs(forced).max() + (0.5 * fc.scale_d * float(fc.scale_w.max())
                                                if level == "ENABLE_ALL" else 0.0)
    np.testing.assert_allclose(res[LOGITS], forced, rtol=0, atol=atol)


def test_end_to_end_logits(tmp_path, nsfw, exported):
    """Free-running logits. The chaos scale is measured on torch itself: the same fake-quant
    model in float64 arithmetic vs float32. ORT (optimizations off and on, int8 and uint8) must
    stay within 6 dB of that (an implementation that differs from torch only by rounding
    lands near it; a wrong zero point, axis, Q placement or bias costs far more) and give the
    same class."""
    gm, recs, fq, x = nsfw
    ref = torch_logits(fq, x)
    chaos = sqnr_db(ref, torch_logits(fake_quant_graph(gm, recs).double(), x, torch.float64))
    assert sqnr_db(torch_logits(gm, x), ref) < 60  # it is a quantized model
    for act in ("int8", "uint8"):
        lp = str(tmp_path / f"{act}_logits.onnx")
        onnx.utils.extract_model(exported[act][1], lp, ["data"], [LOGITS])
        for level in ("DISABLE_ALL", "ENABLE_ALL"):
            out = ort_session(lp, level).run(None, {"data": x})[0]
            assert sqnr_db(ref, out) >= chaos - 6.0, (act, level, sqnr_db(ref, out), chaos)
            assert (out.argmax(1) == ref.argmax(1)).all()


@pytest.fixture()
def small(tmp_path):
    proto, model = make_net(tmp_path, SMALL_BODY, {"data": [2, 3, 8, 8]}, small_blobs(np.random.default_rng(0)))
    gm = load_caffe(proto, model)
    x = np.random.default_rng(1).standard_normal((2, 3, 8, 8)).astype(np.float32)
    return gm, minmax_records(gm, torch.from_numpy(x)), x


def test_quantize_residual_outputs(tmp_path, small):
    """Opt-in: conv2 and conv3 feed the Eltwise, so each gets a Q/DQ on its output with
    asymmetric min/max factors of its fake-quant output over the calibration data. Reference
    written here: the torch fake-quant model with those two outputs fake-quantized by hand."""
    gm, recs, x = small
    _, qp = export_onnx(gm, recs, str(tmp_path / "r"), quantize_residual_outputs=True, calibration_data=x)
    m = onnx.load(qp)
    outq = {n.input[0]: n for n in m.graph.node if n.op_type == "QuantizeLinear" and n.name.startswith(("conv2_out", "conv3_out"))}
    assert set(outq) == {"conv2", "conv3"}
    fq = fake_quant_graph(gm, recs)
    mods = layer_modules(fq)
    seen = {}
    hs = [mods[n].register_forward_hook(lambda m_, a, o, n=n: seen.__setitem__(n, o.clone())) for n in ("conv2", "conv3")]
    with torch.no_grad():
        fq(torch.from_numpy(x))
    for h in hs:
        h.remove()

    def fq_out(n):
        def f(m_, a, o):
            lo, hi = min(float(seen[n].min()), 0.0), max(float(seen[n].max()), 0.0)
            s = np.float32((hi - lo) / 255)
            z = -round(lo / s) - 128
            return ((torch.clamp(torch.round(o / s) + z, -128, 127) - z) * s).float()
        return f
    hs = [mods[n].register_forward_hook(fq_out(n)) for n in ("conv2", "conv3")]
    with torch.no_grad():
        want = fq(torch.from_numpy(x))["fc1"].numpy()
    for h in hs:
        h.remove()
    got = ort_session(qp, "DISABLE_ALL").run(None, {"data": x})[0]
    np.testing.assert_allclose(got, want, rtol=0, atol=FLOAT_RTOL * np.abs(want).max())
    _, plain = export_onnx(gm, recs, str(tmp_path / "p"))
    base = ort_session(plain, "DISABLE_ALL").run(None, {"data": x})[0]
    assert np.abs(base - got).max() > 0  # the option changes the model (no longer AMCT-exact)


RESNET_BODY = '''
layer { name: "conv1" type: "Convolution" bottom: "data" top: "c1" convolution_param { num_output: 4 kernel_size: 3 pad: 1 } }
layer { name: "relu1" type: "ReLU" bottom: "c1" top: "c1" }
layer { name: "conv2" type: "Convolution" bottom: "c1" top: "c2" convolution_param { num_output: 4 kernel_size: 1 } }
layer { name: "relu2" type: "ReLU" bottom: "c2" top: "c2" }
layer { name: "conv3" type: "Convolution" bottom: "c2" top: "c3" convolution_param { num_output: 4 kernel_size: 1 } }
layer { name: "sum1" type: "Eltwise" bottom: "c3" bottom: "c1" top: "s1" }
layer { name: "relu3" type: "ReLU" bottom: "s1" top: "s1" }
layer { name: "conv4" type: "Convolution" bottom: "s1" top: "c4" convolution_param { num_output: 4 kernel_size: 1 } }
layer { name: "sum2" type: "Eltwise" bottom: "c4" bottom: "s1" top: "s2" }
layer { name: "fc1" type: "InnerProduct" bottom: "s2" top: "fc1" inner_product_param { num_output: 5 } }
layer { name: "tanh1" type: "TanH" bottom: "c1" top: "t1" }
layer { name: "sum3" type: "Eltwise" bottom: "s2" bottom: "t1" top: "s3" }
'''


def test_quantize_eltwise_speed_mode(tmp_path):
    """Speed mode on a two-block net with every kind of Eltwise: sum1 (identity shortcut c1,
    output through ReLU into conv4), sum2 (shortcut s1, output only into fc1), sum3 (an input
    nothing quantizes, output a network output). Reference written here: the torch fake-quant
    model with, by hand, the residual conv outputs (conv3, conv4) and the unquantized tensors
    (t1, s3) fake-quantized with min/max factors, and each shortcut read as its consumer
    quantizes it (c1 with conv2's factors, s1 with conv4's, s2 with fc1's). ORT with graph
    optimizations off computes it to float rounding; with them on, all three Adds run as
    QLinearAdd and conv2..4 as QLinearConv (uint8 activations)."""
    rng = np.random.default_rng(4)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)
    blobs = {"conv1": [f(4, 3, 3, 3), f(4)], "fc1": [f(5, 256) * 0.1, f(5)],
             **{c: [f(4, 4, 1, 1) * 0.5, f(4)] for c in ("conv2", "conv3", "conv4")}}
    proto, model = make_net(tmp_path, RESNET_BODY, {"data": [2, 3, 8, 8]}, blobs)
    gm = load_caffe(proto, model)
    x = np.random.default_rng(5).standard_normal((2, 3, 8, 8)).astype(np.float32)
    recs = minmax_records(gm, torch.from_numpy(x))
    assert recs["conv4"].offset_d == -128  # ReLU output: zero at the grid minimum

    fq = fake_quant_graph(gm, recs)
    mods = layer_modules(fq)
    seen = {}
    hs = [mods[n].register_forward_hook(lambda m_, a, o, n=n: seen.__setitem__(n, o.clone()))
          for n in ("conv3", "conv4", "tanh1", "sum3")]
    with torch.no_grad():
        fq(torch.from_numpy(x))
    for h in hs:
        h.remove()

    def fq_t(t, s, z):
        s = np.float32(s)
        return ((torch.clamp(torch.round(t / s) + z, -128, 127) - z) * s).float()

    def minmax(n):
        lo, hi = min(float(seen[n].min()), 0.0), max(float(seen[n].max()), 0.0)
        s = np.float32((hi - lo) / 255)
        return s, -round(lo / s) - 128

    def rec(n):
        return recs[n].scale_d, recs[n].offset_d

    out_q = {n: minmax(n) for n in ("conv3", "conv4", "tanh1", "sum3")}
    in_q = {"sum1": [None, rec("conv2")], "sum2": [None, rec("conv4")],
            "sum3": [rec("fc1"), out_q["tanh1"]]}
    hs = [mods[n].register_forward_hook(lambda m_, a, o, n=n: fq_t(o, *out_q[n])) for n in out_q]
    hs += [mods[n].register_forward_pre_hook(
        lambda m_, a, n=n: tuple(t if q is None else fq_t(t, *q) for t, q in zip(a, in_q[n])))
        for n in in_q]
    hs.append(mods["sum2"].register_forward_hook(lambda m_, a, o: fq_t(o, *rec("fc1"))))
    with torch.no_grad():
        want = {k: v.numpy() for k, v in fq(torch.from_numpy(x)).items()}
    for h in hs:
        h.remove()

    _, qp = export_onnx(gm, recs, str(tmp_path / "e"), activations="uint8", quantize_eltwise=True,
                        calibration_data=x, integer_ops=False)
    got = ort_run(qp, x, "DISABLE_ALL", outputs=["fc1", "s3"])
    for k in ("fc1", "s3"):
        np.testing.assert_allclose(got[k], want[k], rtol=0, atol=FLOAT_RTOL * np.abs(want[k]).max())
    sess = ort_session(qp, "ENABLE_ALL", optimized_path=str(tmp_path / "opt.onnx"))
    ops = collections.Counter(n.op_type for n in onnx.load(str(tmp_path / "opt.onnx")).graph.node)
    assert ops["QLinearAdd"] == 3 and ops["Add"] == 0, ops
    # conv1 stays float: its (ReLU) output also feeds the float TanH, so no Q follows it alone
    assert ops["QLinearConv"] == 3 and ops["Conv"] + ops["FusedConv"] == 1, ops
    s3 = sess.run(["s3"], {"data": x})[0]
    # int8 kernels round the int32 accumulators' requantization and the bias their own way:
    # a code may move by one step at some quantizer; two steps of s3's grid bounds it here
    assert np.abs(s3 - got["s3"]).max() <= 2 * out_q["sum3"][0] + 1e-6
    # with an int32 bias the FC's DQ → Gemm (Q/DQ repeated after its Flatten) becomes QGemm
    _, qb = export_onnx(gm, recs, str(tmp_path / "b"), activations="uint8", bias="int32",
                        quantize_eltwise=True, calibration_data=x, integer_ops=False)
    ops = ort_optimized_ops(qb)
    assert ops["QGemm"] == 1 and ops["Gemm"] == 0 and ops["QLinearAdd"] == 3, ops
    _, plain = export_onnx(gm, recs, str(tmp_path / "p"), activations="uint8")
    base = ort_run(plain, x, "DISABLE_ALL", outputs=["s3"])["s3"]
    assert np.abs(base - got["s3"]).max() > 0  # the mode changes the model (not AMCT-exact)


def test_option_errors(tmp_path, small):
    gm, recs, _ = small
    with pytest.raises(ValueError, match="calibration_data"):
        export_onnx(gm, recs, str(tmp_path / "a"), quantize_residual_outputs=True)
    with pytest.raises(ValueError, match="bias"):
        export_onnx(gm, recs, str(tmp_path / "a"), bias="int16")
    with pytest.raises(ValueError, match="activations"):
        export_onnx(gm, recs, str(tmp_path / "a"), activations="int4")
