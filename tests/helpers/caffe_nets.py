"""Test helpers: build small Caffe nets by code, run them through our loader and through
OpenCV's Caffe importer (the independent oracle)."""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Optional

import numpy as np
import torch
from google.protobuf import text_format

from amct_torch.caffe.graph import load_caffe
from amct_torch.caffe.netio import write_net
from amct_torch.proto import amct_caffe_pb2 as pb


def make_net(folder, body: str, inputs: dict[str, Sequence[int]],
             blobs: Optional[dict[str, list[np.ndarray]]] = None, name: str = "net",
             legacy: bool = False) -> tuple[str, str]:
    """Write ``{name}.prototxt`` (Input layer per input + ``body`` layer text) and
    ``{name}.caffemodel`` (the blobs given per layer name; 4-D ones with the legacy
    num/channels/height/width fields when ``legacy``). Returns both paths."""
    head = ""
    for inp, shape in inputs.items():
        dims = " ".join(f"dim: {d}" for d in shape)
        head += f'layer {{ name: "{inp}" type: "Input" top: "{inp}" input_param {{ shape {{ {dims} }} }} }}\n'
    net = text_format.Parse(head + body, pb.NetParameter())
    for layer in net.layer:
        for arr in (blobs or {}).get(layer.name, []):
            b = layer.blobs.add()
            if legacy and np.ndim(arr) == 4:
                b.num, b.channels, b.height, b.width = (int(d) for d in np.shape(arr))
            else:
                b.shape.dim.extend(arr.shape)
            b.data.extend(np.asarray(arr, np.float32).reshape(-1).tolist())
    proto = os.path.join(str(folder), f"{name}.prototxt")
    model = os.path.join(str(folder), f"{name}.caffemodel")
    write_net(net, proto, model)
    return proto, model


def run_ours(proto: str, model: str, *xs: np.ndarray, device: str = "cpu") -> dict[str, np.ndarray]:
    gm = load_caffe(proto, model).to(device)
    with torch.no_grad():
        out = gm(*[torch.from_numpy(np.ascontiguousarray(x)).to(device) for x in xs])
    return {k: v.cpu().numpy() for k, v in out.items()}


def run_cv(proto: str, model: str, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
    import cv2
    net = cv2.dnn.readNetFromCaffe(proto, model)
    net.setPreferableBackend(cv2.dnn.DNN_BACKEND_OPENCV)
    for k, v in inputs.items():
        net.setInput(np.ascontiguousarray(v, dtype=np.float32), k)
    res = net.forward(outputs)
    return dict(zip(outputs, [np.asarray(r) for r in res]))


def rand(*shape: int, seed: int = 0, scale: float = 1.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def assert_close(ours: np.ndarray, ref: np.ndarray, tol: float = 1e-4) -> None:
    """Shapes equal (up to trailing/leading ones OpenCV may add) and values within tol,
    relative to the reference's largest magnitude (absolute below magnitude 1)."""
    ref = np.asarray(ref, np.float32)
    assert ours.size == ref.size, (ours.shape, ref.shape)
    if ours.shape != ref.shape:
        ref = ref.reshape(ours.shape)
    scale = max(1.0, float(np.abs(ref).max()) if ref.size else 1.0)
    err = float(np.abs(ours - ref).max()) if ref.size else 0.0
    assert err <= tol * scale, f"max abs diff {err} (scale {scale})"
