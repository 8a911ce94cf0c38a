"""Real deploy prototxts (tests/caffe/data) with weights built by code, and OpenCV as their
float reference.

The weights: He-normal convolutions/inner products rescaled, in one forward pass over random
inputs, so that each output channel has a spread near exp(N(0, 0.3)) and a mean near 0.2 of
it (a vector output: one factor for the whole layer, its few values per channel being no
statistics); BatchNorm mean 0 / variance 1, Scale γ in [0.8, 1.2], β ~ N(0, 0.1), PReLU slopes
in [0.05, 0.3]. A Deconvolution with ``lr_mult: 0`` and a bilinear filler keeps it. Activations
then stay O(1) through deep nets, as trained nets keep them."""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Optional

import numpy as np
import torch

from amct_torch.caffe.graph import build_graph, layer_modules, set_inplace
from amct_torch.caffe.layers import traits
from amct_torch.caffe.netio import read_net, save_caffe

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "caffe", "data")


def real_prototxt(name: str) -> str:
    """The path of ``tests/caffe/data/{name}.prototxt``."""
    return os.path.join(DATA, f"{name}.prototxt")


def _normalizing_hook(rng: np.random.Generator):
    def hook(m, args, y):
        yd = y.detach()
        dims = [d for d in range(yd.dim()) if d != 1]
        mean, sd = yd.mean(dim=dims), yd.std(dim=dims).clamp_min(1e-3)
        g = torch.from_numpy(np.exp(rng.normal(0, 0.3, tuple(sd.shape))).astype(np.float32))
        beta = torch.from_numpy(rng.normal(0.2, 0.3, tuple(mean.shape)).astype(np.float32)) * g
        f = g / sd
        if yd.dim() == 2 or yd[0, 0].numel() == 1:
            f = torch.full_like(sd, float(g.mean() / yd.std().clamp_min(1e-3)))
        w = m.weight
        if traits.is_transposed(m):
            grp, cin, opg = int(m.groups), w.shape[0], w.shape[1]
            w.data = (w.data.reshape(grp, cin // grp, opg, *w.shape[2:])
                      * f.reshape(grp, 1, opg, 1, 1)).reshape(w.shape)
        else:
            w.data = w.data * f.reshape((-1,) + (1,) * (w.dim() - 1))
        view = (1, -1) + (1,) * (yd.dim() - 2)
        if m.bias is None:
            return yd * f.reshape(view)
        shift = beta - mean * f
        m.bias.data = m.bias.data * f + shift
        return yd * f.reshape(view) + shift.reshape(view)
    return hook


def code_weights(proto: str, folder: str, seed: int = 0, batch: int = 4,
                 allow_unknown_fields: bool = False) -> str:
    """Write ``{folder}/weights.caffemodel`` for ``proto`` (see the module docstring); returns
    its path."""
    parsed = read_net(proto)
    gm = build_graph(parsed, allow_unknown_fields=allow_unknown_fields)
    set_inplace(gm, False)
    rng = np.random.default_rng(seed)
    hooks = []
    for mod in layer_modules(gm).values():
        t = mod.caffe_type
        if t == "BatchNorm":
            mod.mean.fill_(0.0)
            mod.var.fill_(1.0)
        elif t in ("Scale", "PReLU") and getattr(mod, "weight", None) is not None:
            lo, hi = (0.8, 1.2) if t == "Scale" else (0.05, 0.3)
            mod.weight.data = torch.from_numpy(rng.uniform(lo, hi, tuple(mod.weight.shape)).astype(np.float32))
            if t == "Scale" and mod.bias is not None:
                mod.bias.data = torch.from_numpy(rng.normal(0, 0.1, tuple(mod.bias.shape)).astype(np.float32))
        if traits.weight_layout(mod) is None:
            continue
        params = mod.layer_param.param
        if traits.is_transposed(mod) and params and params[0].lr_mult == 0 \
                and mod.layer_param.convolution_param.weight_filler.type == "bilinear":
            continue  # bilinear upsampling: its filler (a deploy file without it: weights by code)
        w = mod.weight
        fan_in = max(1, w[0].numel())
        w.data = torch.from_numpy(rng.normal(0, np.sqrt(2.0 / fan_in), tuple(w.shape)).astype(np.float32))
        hooks.append(mod.register_forward_hook(_normalizing_hook(rng)))
    xs = [torch.from_numpy(rng.standard_normal([batch] + list(s[1:])).astype(np.float32))
          for _, s in parsed.inputs]
    with torch.no_grad():
        gm(*xs)
    for h in hooks:
        h.remove()
    model = os.path.join(str(folder), "weights.caffemodel")
    save_caffe(gm, os.path.join(str(folder), "rewritten.prototxt"), model)
    return model


def opencv_outputs(proto: str, model: str, inputs: dict[str, np.ndarray], outputs: Sequence[str],
                   folder: Optional[str] = None, renames: Optional[dict[str, str]] = None) -> dict[str, np.ndarray]:
    """OpenCV's Caffe importer's outputs by name; ``renames`` maps a fork's type to the BVLC
    type whose forward it shares (``DepthwiseConvolution`` → ``Convolution``), written to a
    copy of the prototxt under ``folder``."""
    import cv2
    if renames:
        with open(proto) as f:
            text = f.read()
        for old, new in renames.items():
            text = text.replace(f'"{old}"', f'"{new}"')
        proto = os.path.join(str(folder), "opencv.prototxt")
        with open(proto, "w") as f:
            f.write(text)
    net = cv2.dnn.readNetFromCaffe(proto, model)
    net.setPreferableBackend(cv2.dnn.DNN_BACKEND_OPENCV)
    for k, v in inputs.items():
        net.setInput(np.ascontiguousarray(v, np.float32), k)
    return dict(zip(outputs, (np.asarray(o) for o in net.forward(list(outputs)))))


def rel_diff(ours: np.ndarray, ref: np.ndarray) -> float:
    """max |ours − ref| / max(1, max |ref|)."""
    ref = np.asarray(ref, np.float32).reshape(np.shape(ours))
    return float(np.abs(np.asarray(ours, np.float32) - ref).max() / max(1.0, float(np.abs(ref).max())))


def sized_copy(proto: str, folder: str, size: int) -> str:
    """A copy of ``proto`` under ``folder`` whose (first) input is 1 × C × size × size."""
    from amct_torch.caffe.netio import net_to_prototxt_text, parse_prototxt
    net = parse_prototxt(proto)
    if net.input_dim:
        net.input_dim[0], net.input_dim[2], net.input_dim[3] = 1, size, size
    elif net.input_shape:
        dims = net.input_shape[0].dim
        dims[0], dims[2], dims[3] = 1, size, size
    else:
        dims = next(l for l in net.layer if l.type == "Input").input_param.shape[0].dim
        dims[0], dims[2], dims[3] = 1, size, size
    out = os.path.join(str(folder), f"{size}_{os.path.basename(proto)}")
    with open(out, "w") as f:
        f.write(net_to_prototxt_text(net))
    return out
