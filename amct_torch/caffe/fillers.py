"""Blobs a caffemodel does not hold, filled as Caffe fills them when it builds the net.

Why: Caffe builds every layer's blobs with its fillers and then copies the trained blobs of the
layers the caffemodel names; real models rely on this for weights never trained (an upsampling
``Deconvolution`` with a ``bilinear`` filler). Only the deterministic fillers (``constant``,
``bilinear``) can be reproduced: a random one, or a weight blob without a filler, is refused
naming the caffemodel and the layer; biases and per-channel factors fall back to Caffe's
identity defaults. docs/caffe_format.md, "Layers the caffemodel does not name"."""
from __future__ import annotations

import math
from typing import Optional

import numpy as np

from amct_torch.caffe.layers.traits import fillers
from amct_torch.errors import ModelError
from amct_torch.proto import amct_caffe_pb2 as pb

#: Filler types whose values do not depend on a random generator.
DETERMINISTIC = ("constant", "bilinear")


def has_fillers(layer: pb.LayerParameter) -> bool:
    """True when Caffe fills this layer's blobs from fillers (so a caffemodel may omit it)."""
    return _spec(layer) is not None


def _spec(layer: pb.LayerParameter) -> Optional[tuple[str, list[tuple[str, Optional[float]]]]]:
    spec = fillers(layer.type)  # the type's own (``CaffeLayer.fillers``)
    return None if spec is None else (spec[0], list(spec[1]))


def fill_blobs(layer: pb.LayerParameter, shapes: list[tuple[int, ...]], weights_file: str) -> list[np.ndarray]:
    """The blobs of ``layer`` (Caffe's order, the given ``shapes``) from its fillers; a random
    or missing weight filler is a ModelError naming the caffemodel and the layer."""
    spec = _spec(layer)
    if spec is None:
        raise ModelError(f"the caffemodel has no weight blobs for this {layer.type} layer",
                         file=weights_file, layer=layer.name)
    param_name, fillers = spec
    param = getattr(layer, param_name)
    if layer.type == "Scale" and len(layer.bottom) == 2:
        fillers = fillers[1:]  # the scale comes from the second bottom: only the bias is a blob
    out = []
    for (field, default), shape in zip(fillers, shapes):
        given = param.HasField(field)
        if not given:
            if default is None:
                raise ModelError(f"the caffemodel has no weight blobs for this layer and the prototxt "
                                 f"gives no {field}: Caffe would start from all-zero weights; give "
                                 "a caffemodel with the layer's trained weights",
                                 file=weights_file, layer=layer.name)
            out.append(np.full(shape, default, np.float32))
            continue
        out.append(_fill(getattr(param, field), shape, field, layer, weights_file))
    return out


def _fill(filler: pb.FillerParameter, shape: tuple[int, ...], field: str, layer: pb.LayerParameter,
          weights_file: str) -> np.ndarray:
    kind = filler.type
    if kind not in DETERMINISTIC:
        raise ModelError(f"the caffemodel has no weight blobs for this layer and its {field} is "
                         f"'{kind}': Caffe would fill random values when it builds the net, so the "
                         "model is not reproducible; give a caffemodel with the layer's trained "
                         "weights", file=weights_file, layer=layer.name)
    if kind == "constant":
        return np.full(shape, filler.value, np.float32)
    if len(shape) != 4 or shape[2] != shape[3]:
        raise ModelError(f"{field} 'bilinear' needs a square 4-D blob, this one is {list(shape)}",
                         file=weights_file, layer=layer.name)
    return bilinear(shape)


def bilinear(shape: tuple[int, ...]) -> np.ndarray:
    """Caffe's BilinearFiller: every (n, c) kernel of a (N, C, K, K) blob holds
    (1 - |x/f - c|)(1 - |y/f - c|) with f = ceil(K/2) and c = (2f - 1 - f mod 2) / (2f), the
    weights of a bilinear upsampling by f with a Deconvolution of kernel K and stride f."""
    k = int(shape[-1])
    f = math.ceil(k / 2.0)
    c = (2 * f - 1 - f % 2) / (2.0 * f)
    ramp = 1.0 - np.abs(np.arange(k, dtype=np.float64) / f - c)
    kernel = (ramp[:, None] * ramp[None, :]).astype(np.float32)
    return np.broadcast_to(kernel, tuple(shape)).copy()
