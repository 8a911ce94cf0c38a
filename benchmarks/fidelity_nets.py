"""Small Caffe nets built by code for ``bench_fidelity.py``, with weights that give realistic
activations: He-initialized, then normalized layer by layer on natural-image crops (each
convolution's output channels measured and rescaled to a per-channel scale drawn log-normally
with a small shift, as BN folding leaves them: unequal channel ranges, mostly positive-mean
inputs to the next layer). Random weights without this give activations that shrink or blow
up through the net, and a fidelity that means nothing.

Families: a MobileNet-style depthwise net (ConvolutionDepthwise + 1x1), PReLU cascade face
nets at 12x12, 24x24 and 48x48 (MTCNN-like P/R/O nets), a CIFAR-style ReLU net, a VGG-style
SSD detector (three PriorBox heads, Softmax, DetectionOutput). Each family's body gives (layer
text, input size, its output layer or layers); ``build`` writes (prototxt, caffemodel).
"""
from __future__ import annotations

import os
from typing import Callable

import numpy as np
import torch

from amct_torch.caffe.graph import layer_modules


def _conv(name, bottom, c, k, s=1, p=0, group=None, depthwise=False):
    kind = "ConvolutionDepthwise" if depthwise else "Convolution"
    g = f" group: {group}" if group else ""
    return (f'layer {{ name: "{name}" type: "{kind}" bottom: "{bottom}" top: "{name}" '
            f'convolution_param {{ num_output: {c} kernel_size: {k} stride: {s} pad: {p}{g} }} }}\n')


def _act(name, bottom, kind):
    return f'layer {{ name: "{name}" type: "{kind}" bottom: "{bottom}" top: "{bottom}" }}\n'


def _pool(name, bottom, k, s, kind="MAX", global_=False):
    if global_:
        return (f'layer {{ name: "{name}" type: "Pooling" bottom: "{bottom}" top: "{name}" '
                f'pooling_param {{ pool: {kind} global_pooling: true }} }}\n')
    return (f'layer {{ name: "{name}" type: "Pooling" bottom: "{bottom}" top: "{name}" '
            f'pooling_param {{ pool: {kind} kernel_size: {k} stride: {s} }} }}\n')


def _fc(name, bottom, n):
    return (f'layer {{ name: "{name}" type: "InnerProduct" bottom: "{bottom}" top: "{name}" '
            f'inner_product_param {{ num_output: {n} }} }}\n')


def mobilenet_body() -> tuple[str, int, str]:
    b = _conv("conv0", "data", 16, 3, 2, 1) + _act("relu0", "conv0", "ReLU")
    x, c = "conv0", 16
    for i, (out, s) in enumerate([(32, 1), (64, 2), (64, 1), (128, 2), (128, 1)]):
        b += _conv(f"dw{i}", x, c, 3, s, 1, depthwise=True) + _act(f"dwr{i}", f"dw{i}", "ReLU")
        b += _conv(f"pw{i}", f"dw{i}", out, 1) + _act(f"pwr{i}", f"pw{i}", "ReLU")
        x, c = f"pw{i}", out
    b += _pool("gap", x, 0, 0, "AVE", True) + _fc("fc", "gap", 10)
    return b, 64, "fc"


def pnet_body() -> tuple[str, int, str]:
    b = _conv("conv1", "data", 10, 3) + _act("prelu1", "conv1", "PReLU") + _pool("pool1", "conv1", 2, 2)
    b += _conv("conv2", "pool1", 16, 3) + _act("prelu2", "conv2", "PReLU")
    b += _conv("conv3", "conv2", 32, 3) + _act("prelu3", "conv3", "PReLU")
    b += _conv("conv4", "conv3", 6, 1)
    return b, 12, "conv4"


def rnet_body() -> tuple[str, int, str]:
    b = _conv("conv1", "data", 28, 3) + _act("prelu1", "conv1", "PReLU") + _pool("pool1", "conv1", 3, 2)
    b += _conv("conv2", "pool1", 48, 3) + _act("prelu2", "conv2", "PReLU") + _pool("pool2", "conv2", 3, 2)
    b += _conv("conv3", "pool2", 64, 2) + _act("prelu3", "conv3", "PReLU")
    b += _fc("fc4", "conv3", 128) + _act("prelu4", "fc4", "PReLU") + _fc("fc5", "fc4", 6)
    return b, 24, "fc5"


def onet_body() -> tuple[str, int, str]:
    b = _conv("conv1", "data", 32, 3) + _act("prelu1", "conv1", "PReLU") + _pool("pool1", "conv1", 3, 2)
    b += _conv("conv2", "pool1", 64, 3) + _act("prelu2", "conv2", "PReLU") + _pool("pool2", "conv2", 3, 2)
    b += _conv("conv3", "pool2", 64, 3) + _act("prelu3", "conv3", "PReLU") + _pool("pool3", "conv3", 2, 2)
    b += _conv("conv4", "pool3", 128, 2) + _act("prelu4", "conv4", "PReLU")
    b += _fc("fc5", "conv4", 256) + _act("prelu5", "fc5", "PReLU") + _fc("fc6", "fc5", 16)
    return b, 48, "fc6"


def cifar_body() -> tuple[str, int, str]:
    b = _conv("conv1", "data", 32, 5, 1, 2) + _pool("pool1", "conv1", 3, 2) + _act("relu1", "pool1", "ReLU")
    b += _conv("conv2", "pool1", 32, 5, 1, 2) + _act("relu2", "conv2", "ReLU") + _pool("pool2", "conv2", 3, 2, "AVE")
    b += _conv("conv3", "pool2", 64, 5, 1, 2) + _act("relu3", "conv3", "ReLU") + _pool("pool3", "conv3", 3, 2, "AVE")
    b += _fc("ip1", "pool3", 64) + _act("relu4", "ip1", "ReLU") + _fc("ip2", "ip1", 10)
    return b, 32, "ip2"


def ssd_body() -> tuple[str, int, tuple[str, ...]]:
    """A VGG-style SSD (3x3 ReLU convolutions and max pooling, 96x96) with three heads (24x24,
    12x12, 6x6): per head a location and a confidence convolution, Permute + Flatten, a
    PriorBox; Concat of each, the confidences reshaped, Softmax over the 3 classes, Flatten,
    and DetectionOutput (scored before it: ``mbox_loc`` and the confidence logits ``mbox_conf``)."""
    c = 3
    b = _conv("conv1_1", "data", 16, 3, 1, 1) + _act("relu1_1", "conv1_1", "ReLU")
    b += _conv("conv1_2", "conv1_1", 16, 3, 1, 1) + _act("relu1_2", "conv1_2", "ReLU") + _pool("pool1", "conv1_2", 2, 2)
    b += _conv("conv2_1", "pool1", 32, 3, 1, 1) + _act("relu2_1", "conv2_1", "ReLU")
    b += _conv("conv2_2", "conv2_1", 32, 3, 1, 1) + _act("relu2_2", "conv2_2", "ReLU") + _pool("pool2", "conv2_2", 2, 2)
    b += _conv("conv3_1", "pool2", 64, 3, 1, 1) + _act("relu3_1", "conv3_1", "ReLU")
    b += _conv("conv3_2", "conv3_1", 64, 3, 1, 1) + _act("relu3_2", "conv3_2", "ReLU") + _pool("pool3", "conv3_2", 2, 2)
    b += _conv("conv4_1", "pool3", 64, 3, 1, 1) + _act("relu4_1", "conv4_1", "ReLU") + _pool("pool4", "conv4_1", 2, 2)
    b += _conv("conv5_1", "pool4", 64, 3, 1, 1) + _act("relu5_1", "conv5_1", "ReLU")
    heads = [("h1", "conv3_2", "min_size: 10 max_size: 20 aspect_ratio: 2 flip: true clip: false", 4),
             ("h2", "conv4_1", "min_size: 24 max_size: 40 aspect_ratio: 2 flip: true clip: false", 4),
             ("h3", "conv5_1", "min_size: 48 max_size: 80 aspect_ratio: 2 aspect_ratio: 3 flip: true clip: true", 6)]
    finals = []
    for h, src, pp, n_prior in heads:
        b += _conv(f"{h}_loc", src, n_prior * 4, 3, 1, 1) + _conv(f"{h}_conf", src, n_prior * c, 3, 1, 1)
        finals += [f"{h}_loc", f"{h}_conf"]
        for kind in ("loc", "conf"):
            b += (f'layer {{ name: "{h}_{kind}_perm" type: "Permute" bottom: "{h}_{kind}" top: "{h}_{kind}_perm" '
                  f'permute_param {{ order: 0 order: 2 order: 3 order: 1 }} }}\n'
                  f'layer {{ name: "{h}_{kind}_flat" type: "Flatten" bottom: "{h}_{kind}_perm" top: "{h}_{kind}_flat" '
                  f'flatten_param {{ axis: 1 }} }}\n')
        b += (f'layer {{ name: "{h}_prior" type: "PriorBox" bottom: "{src}" bottom: "data" top: "{h}_prior" '
              f'prior_box_param {{ {pp} variance: 0.1 variance: 0.1 variance: 0.2 variance: 0.2 }} }}\n')
    for kind, axis in (("loc", 1), ("conf", 1), ("prior", 2)):
        tops = "".join(f'bottom: "{h}_{kind}{"" if kind == "prior" else "_flat"}" ' for h, *_ in heads)
        name = "mbox_priorbox" if kind == "prior" else f"mbox_{kind}"
        b += f'layer {{ name: "{name}" type: "Concat" {tops}top: "{name}" concat_param {{ axis: {axis} }} }}\n'
    b += (f'layer {{ name: "mbox_conf_reshape" type: "Reshape" bottom: "mbox_conf" top: "mbox_conf_reshape" '
          f'reshape_param {{ shape {{ dim: 0 dim: -1 dim: {c} }} }} }}\n'
          'layer { name: "mbox_conf_softmax" type: "Softmax" bottom: "mbox_conf_reshape" top: "mbox_conf_softmax" '
          'softmax_param { axis: 2 } }\n'
          'layer { name: "mbox_conf_flatten" type: "Flatten" bottom: "mbox_conf_softmax" top: "mbox_conf_flatten" '
          'flatten_param { axis: 1 } }\n'
          'layer { name: "detection_out" type: "DetectionOutput" bottom: "mbox_loc" bottom: "mbox_conf_flatten" '
          f'bottom: "mbox_priorbox" top: "detection_out" detection_output_param {{ num_classes: {c} '
          'share_location: true background_label_id: 0 nms_param { nms_threshold: 0.45 top_k: 100 } '
          'code_type: CENTER_SIZE keep_top_k: 50 confidence_threshold: 0.3 } }\n')
    return b, 96, tuple(finals)


FAMILIES: dict[str, Callable[[], tuple[str, int, object]]] = {
    "mobilenet_depthwise": mobilenet_body, "prelu_face_12": pnet_body, "prelu_face_24": rnet_body,
    "prelu_face_48": onet_body, "cifar": cifar_body, "ssd": ssd_body}


def build(family: str, folder: str, crops: np.ndarray, seed: int = 0) -> tuple[str, str, object]:
    """Write the family's net with normalized weights under ``folder``; ``crops``: N×3×S×S
    natural-image crops (the data the weights are normalized on). Returns (prototxt,
    caffemodel, the output layer or layers)."""
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
    from helpers.caffe_nets import make_net

    body, size, logits = FAMILIES[family]()
    finals = (logits,) if isinstance(logits, str) else tuple(logits)  # the output layers: no shift
    os.makedirs(folder, exist_ok=True)
    proto, _ = make_net(folder, body, {"data": [1, 3, size, size]}, {}, name=family)
    gm = _load_empty(proto)
    rng = np.random.default_rng(seed)
    x = torch.from_numpy(crops / 64.0)  # mean-subtracted BGR scaled to about unit variance
    mods = layer_modules(gm)
    with torch.no_grad():
        for name, mod in mods.items():
            if mod.caffe_type == "PReLU":
                mod.weight.data = torch.from_numpy(rng.uniform(0.05, 0.3, mod.weight.shape).astype(np.float32))
            if getattr(mod, "weight", None) is None or mod.caffe_type not in (
                    "Convolution", "ConvolutionDepthwise", "InnerProduct"):
                continue
            w = mod.weight
            fan_in = w[0].numel()
            w.data = torch.from_numpy(rng.normal(0, np.sqrt(2.0 / fan_in), w.shape).astype(np.float32))
            got = {}
            h = mod.register_forward_hook(lambda _m, _a, y, got=got: got.setdefault("y", y.detach()))
            gm(x)
            h.remove()
            y = got["y"]
            dims = [0] + list(range(2, y.dim()))
            m, sd = y.mean(dim=dims), y.std(dim=dims).clamp_min(1e-6)
            last = name in finals
            g = torch.full_like(sd, 3.0) if last else torch.from_numpy(
                np.exp(rng.normal(0, 0.6, sd.shape)).astype(np.float32))
            beta = torch.zeros_like(m) if last else torch.from_numpy(
                rng.normal(0.2, 0.4, m.shape).astype(np.float32)) * g
            f = (g / sd).reshape((-1,) + (1,) * (w.dim() - 1))
            w.data = w.data * f
            b = mod.bias if mod.bias is not None else torch.zeros_like(m)
            mod.bias.data = (b - m) * g / sd + beta
    blobs = {}
    for name, mod in mods.items():
        if mod.caffe_type == "PReLU":
            blobs[name] = [mod.weight.detach().numpy()]
        elif getattr(mod, "weight", None) is not None:
            blobs[name] = [mod.weight.detach().numpy(), mod.bias.detach().numpy()]
    proto, model = make_net(folder, body, {"data": [1, 3, size, size]}, blobs, name=family)
    return proto, model, logits


def _load_empty(proto: str):
    """The net of ``proto`` with zero weights (the loader sizes them from the input shape)."""
    from amct_torch.caffe.graph import build_graph
    from amct_torch.caffe.netio import read_net
    return build_graph(read_net(proto))


def input_size(family: str) -> int:
    return FAMILIES[family]()[1]
