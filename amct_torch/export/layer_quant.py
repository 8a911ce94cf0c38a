"""Per-layer quantization arithmetic shared by every exporter (Caffe fake-quant, deploy, ONNX).

Why one place: the fake-quant weights, the deploy int8 weights and int32 bias, the DeQuant
factors and the ONNX initializers must be the same numbers, so they are computed once here
from the graph's (fused) float weights and the record's factors (docs/algorithms.md, docs/export.md).
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from amct_torch.algorithms.quant import channel_view, quantize
from amct_torch.caffe.graph import layer_modules
from amct_torch.caffe.layers import CaffeLayer, is_quantizable
from amct_torch.caffe.layers.traits import is_transposed, is_weighted
from amct_torch.errors import ExportError, RecordError
from amct_torch.record import LayerRecord

INT32_MIN, INT32_MAX = -(2 ** 31), 2 ** 31 - 1


@dataclass
class LayerQuant:
    """Everything an exporter needs for one quantized layer.

    ``scale_w`` has one value per output channel (a per-tensor record is broadcast to C_out);
    ``int8_weight``/``fake_weight`` keep the module's torch/Caffe layout; ``bias_int32`` is
    round(b / (scale_d·scale_w_c)) (None without bias); ``deq_scale`` = float32(scale_d·scale_w)
    per output channel (AVE Pooling: one value, scale_d)."""

    name: str
    type: str
    module: CaffeLayer
    scale_d: float
    offset_d: int
    per_channel: bool = False
    scale_w: Optional[np.ndarray] = None      # float32 [C_out]
    int8_weight: Optional[np.ndarray] = None  # int8, layout of module.weight
    fake_weight: Optional[np.ndarray] = None  # float32, layout of module.weight
    bias: Optional[np.ndarray] = None         # float32 [C_out]
    bias_int32: Optional[np.ndarray] = None   # int32 [C_out]
    deq_scale: Optional[np.ndarray] = None    # float32 [C_out] or [1]

    @property
    def weighted(self) -> bool:
        return is_weighted(self.type)

    @property
    def joint(self) -> bool:
        """A joint_quant Eltwise: all inputs quantized with one factor, no DeQuant."""
        return self.type == "Eltwise"


def _groups(module: CaffeLayer) -> int:
    return int(getattr(module, "groups", 1))


def _out_channels(module: CaffeLayer) -> int:
    if is_transposed(module):
        return int(module.weight.shape[1]) * _groups(module)
    return int(module.weight.shape[0])


def layer_quant(name: str, module: CaffeLayer, rec: LayerRecord, file: Optional[str] = None,
                weights: bool = True, fake: bool = True, rows: bool = False) -> LayerQuant:
    """Quantize one layer's weights with the record's scale_w (ARQ grid: clamp(round(w/s),
    -128, 127)) and derive its int32 bias and DeQuant factors. A bias that does not fit int32
    is an ExportError naming the layer. ``weights`` False: everything but the int8 and
    fake-quant weights (the checks and factors alone, without a copy of the weights); ``fake``
    False: the int8 weights without the fake-quant ones (the ONNX exporter's need). ``rows``:
    the one weight a Caffe writer needs (the fake-quant weights, or with ``fake`` False the
    int8 ones) as ``RowBlocks``, computed as it is written."""
    assert rec.scale_d is not None and rec.offset_d is not None  # plan_layers refused the others
    lq = LayerQuant(name=name, type=module.caffe_type, module=module, scale_d=float(rec.scale_d),
                    offset_d=int(rec.offset_d))
    sd32 = np.float32(rec.scale_d)
    if not lq.weighted:
        lq.deq_scale = np.array([sd32], np.float32)
        return lq
    c_out = _out_channels(module)
    sw = np.asarray(rec.scale_w, np.float32)
    lq.per_channel = sw.size > 1
    if sw.size == 1:
        sw = np.full(c_out, sw[0], np.float32)
    if sw.size != c_out:
        raise ExportError(f"record has {len(rec.scale_w)} scale_w values, the layer has {c_out} "
                          "output channels", file=file, layer=name)
    lq.scale_w = sw
    lq.deq_scale = (sd32 * sw).astype(np.float32)
    if module.bias is not None:  # before the weights: an overflow costs no quantization
        lq.bias = module.bias.detach().to("cpu", torch.float32).numpy().astype(np.float32)
        lq.bias_int32 = int32_bias(name, lq.bias, sd32, sw, file)
    if weights:  # the ARQ grid with the record's scales
        w = module.weight.detach().to("cpu", torch.float32)
        s = channel_view(torch.from_numpy(sw if lq.per_channel else sw[:1]), tuple(w.shape),
                         module.caffe_type, _groups(module))
        check_not_zeroed(name, w, s, module.caffe_type, file)
        if rows:
            if fake:
                lq.fake_weight = RowBlocks(w, s, fake=True)  # type: ignore[assignment]
            else:
                lq.int8_weight = RowBlocks(w, s, fake=False)  # type: ignore[assignment]
        else:
            lq.int8_weight, lq.fake_weight = quantize_rows(w, s, fake)
    return lq


#: largest |weight| of a channel that calibration quantizes to all zeros by design: its ARQ
#: scale max|w|/127 would be below float32's epsilon, which calibration replaces by 1
NEGLIGIBLE_WEIGHT = 127 * 1.1920929e-07


def check_not_zeroed(name: str, w: torch.Tensor, s: torch.Tensor, caffe_type: str,
                     file: Optional[str] = None) -> None:
    """Refuse (``RecordError`` naming the layer and channel) scale_w values so large that every
    int8 weight of the layer, or of one output channel with weights, rounds to 0: the
    quantized model would lose that layer or channel (``scale_w: 1e6`` on a layer of weights
    around 0.1). A channel whose weights are all below ``NEGLIGIBLE_WEIGHT`` stays allowed:
    calibration itself gives it scale 1 (its scale would be below float32's epsilon)."""
    ratio = w.abs() / s  # |w| / scale_w: codes are 0 exactly where this is at most 0.5
    if is_transposed(caffe_type) or w.dim() < 2:  # channels are not the first axis
        if float(ratio.max()) <= 0.5 and float(w.abs().max()) >= NEGLIGIBLE_WEIGHT:
            raise RecordError(f"scale_w makes every int8 weight of this layer 0 (largest |weight| / "
                              f"scale_w is {float(ratio.max()):.3g}, below 0.5): the quantized layer "
                              "would output only its bias; recalibrate it", file=file, layer=name)
        return
    per = ratio.flatten(1).amax(1)
    has = w.flatten(1).abs().amax(1) >= NEGLIGIBLE_WEIGHT
    bad = torch.nonzero((per <= 0.5) & has).flatten()
    if bad.numel():
        c = int(bad[0])
        every = "every output channel" if bad.numel() == int(has.sum()) else f"output channel {c}"
        raise RecordError(f"scale_w makes every int8 weight of {every} 0 ({bad.numel()} of "
                          f"{w.shape[0]} channels; channel {c}: largest |weight| / scale_w is "
                          f"{float(per[c]):.3g}, below 0.5): the quantized layer would lose them; "
                          "recalibrate it", file=file, layer=name)


def int32_bias(name: str, b: np.ndarray, sd32: np.float32, sw: np.ndarray,
               file: Optional[str] = None) -> np.ndarray:
    """round(b / (scale_d·scale_w_c)) as int32; an ExportError naming the layer and channel
    when a value does not fit int32."""
    step = sd32.astype(np.float64) * sw.astype(np.float64)
    bi = np.rint(b.astype(np.float64) / step)
    bad = np.flatnonzero((bi < INT32_MIN) | (bi > INT32_MAX) | ~np.isfinite(bi))
    if bad.size:
        c = int(bad[0])
        raise ExportError(
            f"int32 bias overflow in output channel {c}: bias {float(b[c])!r} / (scale_d "
            f"{float(sd32)!r} * scale_w {float(sw[c])!r}) does not fit int32; leave this layer "
            "unquantized (add it to skip_layers) or recalibrate", file=file, layer=name)
    return bi.astype(np.int32)


#: weights are quantized this many elements at a time: whole, a VGG-16 fc6 (103 M weights)
#: needed two float temporaries of its own size on top of its two results
CHUNK_ELEMENTS = 1 << 22


def _row_blocks(w: torch.Tensor, s: torch.Tensor) -> Iterator[tuple[slice, torch.Tensor]]:
    """The blocks of rows (axis 0) a large ``w`` is quantized in, each with its scales (one
    block, the whole tensor, when small)."""
    if w.dim() == 0 or w.numel() <= CHUNK_ELEMENTS:
        yield slice(None), s
        return
    rows = int(w.shape[0])
    step = max(1, CHUNK_ELEMENTS // max(1, w[0].numel()))
    per_row = s.dim() > 0 and int(s.shape[0]) == rows and rows > 1
    for a in range(0, rows, step):
        yield slice(a, a + step), (s[a:a + step] if per_row else s)


class RowBlocks:
    """One layer's int8 codes (``fake`` False) or fake-quant weights, computed a block of rows
    at a time when consumed (``blocks``: the values in C order) instead of held whole.

    Why: a streaming Caffe writer copies each block into its file and drops it, so the largest
    layer's quantized weights (a VGG-16's fc6: 0.4 GB as fake-quant float32, with its int8
    codes beside them) never exist at once; the values are ``quantize_rows``'s, block for block
    (every operation is elementwise). ``np.asarray`` gives the whole array."""

    def __init__(self, w: torch.Tensor, s: torch.Tensor, fake: bool,
                 shape: Optional[tuple[int, ...]] = None) -> None:
        self.w, self.s, self.fake = w, s, fake
        self.shape = tuple(int(d) for d in (shape if shape is not None else w.shape))
        self.dtype = np.dtype(np.float32 if fake else np.int8)
        if int(np.prod(self.shape, dtype=np.int64)) != w.numel():
            raise ValueError(f"cannot view {tuple(w.shape)} weights as {self.shape}")

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(self.w.numel())

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def reshape(self, shape: tuple[int, ...]) -> RowBlocks:
        """The same values in another shape (C order), as ``ndarray.reshape``."""
        return RowBlocks(self.w, self.s, self.fake, tuple(shape))

    def blocks(self) -> Iterator[np.ndarray]:
        """The values, flat, one block of rows after another."""
        for rows, ss in _row_blocks(self.w, self.s):
            q = quantize(self.w[rows], ss)
            yield ((q.float() * ss) if self.fake else q).numpy().reshape(-1)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = np.concatenate(list(self.blocks())).reshape(self.shape)
        return out if dtype is None else out.astype(dtype, copy=False)


def quantize_rows(w: torch.Tensor, s: torch.Tensor,
                  fake: bool = True) -> tuple[np.ndarray, Optional[np.ndarray]]:
    """The int8 codes clamp(round(w/s), -128, 127) and the fake-quant weights codes·s (None
    when ``fake`` is False); a large ``w`` is done a block of rows (axis 0) at a time into the
    results. Every operation is elementwise, so the values are those of one whole-tensor
    computation. ``s`` broadcasts against ``w`` (size 1 or ``w``'s size along axis 0)."""
    if w.dim() == 0 or w.numel() <= CHUNK_ELEMENTS:
        q = quantize(w, s)
        return q.numpy(), (q.float() * s).numpy() if fake else None
    q8 = np.empty(tuple(w.shape), np.int8)
    out = np.empty(tuple(w.shape), np.float32) if fake else None
    for rows, ss in _row_blocks(w, s):
        q = quantize(w[rows], ss)
        q8[rows] = q.numpy()
        if out is not None:
            out[rows] = (q.float() * ss).numpy()
    return q8, out


def plan_layers(gm: torch.fx.GraphModule, records: Mapping[str, LayerRecord],
                file: Optional[str] = None, weights: bool = True,
                fake: bool = True) -> dict[str, LayerQuant]:
    """``LayerQuant`` of every record entry, in graph order. A record key that is not a
    quantizable layer of the graph, or lacks factors, is an ExportError (validate the record
    first for the full checks)."""
    mods = layer_modules(gm)
    for key in records:
        if key not in mods:
            raise ExportError("record names a layer that is not in the model", file=file, layer=key)
    out: dict[str, LayerQuant] = {}
    for name, mod in mods.items():
        rec = records.get(name)
        if rec is None:
            continue
        if mod.caffe_type == "Eltwise" and not rec.scale_w:
            # joint_quant: every input of the Eltwise SUM shares this factor
            if rec.scale_d is None or rec.offset_d is None:
                raise ExportError("joint Eltwise entry has no scale_d/offset_d", file=file, layer=name)
            out[name] = LayerQuant(name=name, type="Eltwise", module=mod, scale_d=float(rec.scale_d),
                                   offset_d=int(rec.offset_d))
            continue
        if not is_quantizable(mod):
            raise ExportError(f"layer type {mod.caffe_type} cannot be quantized", file=file, layer=name)
        if rec.scale_d is None or rec.offset_d is None:
            raise ExportError("layer has no activation factors (scale_d/offset_d): calibrate it "
                              "or leave it out", file=file, layer=name)
        if is_weighted(mod) and not rec.scale_w:
            raise ExportError("layer has no weight factors (scale_w)", file=file, layer=name)
        out[name] = layer_quant(name, mod, rec, file, weights, fake)
    return out


class LazyPlan(Mapping[str, LayerQuant]):
    """``plan_layers`` whose checks and factors (the int32 bias overflow included) are done
    at once, while each layer's int8 and fake-quant weights are computed when its entry is
    read, only the last one kept. Why: an exporter writing layer by layer then holds one
    layer's quantized weights instead of the whole model's (a VGG-16: 0.7 GB). ``light``
    is the plan without weights (for what only needs the factors); ``fake`` False: int8
    weights only (the deploy model); ``rows``: the one weight a Caffe writer needs as
    ``RowBlocks`` (a block of rows in memory at a time, see ``layer_quant``)."""

    def __init__(self, gm: torch.fx.GraphModule, records: Mapping[str, LayerRecord],
                 file: Optional[str] = None, fake: bool = True, rows: bool = False) -> None:
        self.light = plan_layers(gm, records, file, weights=False)
        self.records, self.file, self.fake, self.rows = records, file, fake, rows
        self._last: tuple[Optional[str], Optional[LayerQuant]] = (None, None)

    def __getitem__(self, name: str) -> LayerQuant:
        lq = self.light[name]
        if not lq.weighted:
            return lq
        if self._last[0] != name:
            self._last = (None, None)  # the previous layer's arrays go before the next ones exist
            self._last = (name, layer_quant(name, lq.module, self.records[name], self.file,
                                            fake=self.fake, rows=self.rows))
        assert self._last[1] is not None
        return self._last[1]

    def __iter__(self) -> Iterator[str]:
        return iter(self.light)

    def __len__(self) -> int:
        return len(self.light)
