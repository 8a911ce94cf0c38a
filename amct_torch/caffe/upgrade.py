"""Upgrade of old V1 Caffe nets (``layers`` with enum types, NetParameter field 2) to the
current ``layer`` format, following what Caffe's own ``UpgradeV1Net`` does: the enum type
becomes the type string, ``param``/``blob_share_mode``/``blobs_lr``/``weight_decay`` become
``ParamSpec`` entries, and every ``*_param`` is copied under the same name.
"""
from __future__ import annotations

import re
from typing import Optional

from amct_torch.errors import ModelError
from amct_torch.proto import amct_caffe_pb2 as pb

V1 = pb.V1LayerParameter

_TYPE_NAMES: dict[int, str] = {
    V1.ABSVAL: "AbsVal", V1.ACCURACY: "Accuracy", V1.ARGMAX: "ArgMax", V1.BNLL: "BNLL",
    V1.CONCAT: "Concat", V1.CONTRASTIVE_LOSS: "ContrastiveLoss", V1.CONVOLUTION: "Convolution",
    V1.DATA: "Data", V1.DECONVOLUTION: "Deconvolution", V1.DROPOUT: "Dropout",
    V1.DUMMY_DATA: "DummyData", V1.EUCLIDEAN_LOSS: "EuclideanLoss", V1.ELTWISE: "Eltwise",
    V1.EXP: "Exp", V1.FLATTEN: "Flatten", V1.HDF5_DATA: "HDF5Data",
    V1.HDF5_OUTPUT: "HDF5Output", V1.HINGE_LOSS: "HingeLoss", V1.IM2COL: "Im2col",
    V1.IMAGE_DATA: "ImageData", V1.INFOGAIN_LOSS: "InfogainLoss",
    V1.INNER_PRODUCT: "InnerProduct", V1.LRN: "LRN", V1.MEMORY_DATA: "MemoryData",
    V1.MULTINOMIAL_LOGISTIC_LOSS: "MultinomialLogisticLoss", V1.MVN: "MVN",
    V1.POOLING: "Pooling", V1.POWER: "Power", V1.RELU: "ReLU", V1.SIGMOID: "Sigmoid",
    V1.SIGMOID_CROSS_ENTROPY_LOSS: "SigmoidCrossEntropyLoss", V1.SILENCE: "Silence",
    V1.SOFTMAX: "Softmax", V1.SOFTMAX_LOSS: "SoftmaxWithLoss", V1.SPLIT: "Split",
    V1.SLICE: "Slice", V1.TANH: "TanH", V1.WINDOW_DATA: "WindowData",
    V1.THRESHOLD: "Threshold",
}

# V1 fields that have the same name and message type in LayerParameter.
_COPIED = [f.name for f in V1.DESCRIPTOR.fields
           if f.name.endswith("_param") and f.name in pb.LayerParameter.DESCRIPTOR.fields_by_name]


def upgrade_v1_layer(old: pb.V1LayerParameter, file: Optional[str] = None) -> pb.LayerParameter:
    """One V1 layer in the new format; an unknown or NONE type is a ModelError."""
    name = old.name
    if old.type not in _TYPE_NAMES:
        raise ModelError(f"V1 layer type {old.type} cannot be upgraded", file=file, layer=name)
    new = pb.LayerParameter(name=name, type=_TYPE_NAMES[old.type])
    new.bottom.extend(old.bottom)
    new.top.extend(old.top)
    new.include.extend(old.include)
    new.exclude.extend(old.exclude)
    new.loss_weight.extend(old.loss_weight)
    new.blobs.extend(old.blobs)
    n_param = max(len(old.param), len(old.blob_share_mode), len(old.blobs_lr), len(old.weight_decay))
    for i in range(n_param):
        spec = new.param.add()
        if i < len(old.param):
            spec.name = old.param[i]
        if i < len(old.blob_share_mode):
            spec.share_mode = old.blob_share_mode[i]
        if i < len(old.blobs_lr):
            spec.lr_mult = old.blobs_lr[i]
        if i < len(old.weight_decay):
            spec.decay_mult = old.weight_decay[i]
    for field in _COPIED:
        if old.HasField(field):
            getattr(new, field).CopyFrom(getattr(old, field))
    return new


def upgrade_v1(net: pb.NetParameter, file: Optional[str] = None) -> pb.NetParameter:
    """A copy of ``net`` with its V1 ``layers`` converted to ``layer``; a net already in the new
    format is returned as a copy. Having both is an error, as in Caffe."""
    out = pb.NetParameter()
    out.CopyFrom(net)
    if not net.layers:
        return out
    if net.layer:
        raise ModelError("net has both 'layer' and V1 'layers' fields", file=file)
    out.ClearField("layers")
    for old in net.layers:
        out.layer.append(upgrade_v1_layer(old, file))
    # unknown prototxt text recorded under layers[i] follows its layer
    keep = []
    for entry in net.amct_unknown_text:
        path, _, text = entry.partition("\n")
        m = re.match(r"layers\[(\d+)\](?:/(.*))?$", path)
        if m is not None and int(m.group(1)) < len(out.layer):
            out.layer[int(m.group(1))].amct_unknown_text.append(f"{m.group(2) or ''}\n{text}")
        else:
            keep.append(entry)
    out.ClearField("amct_unknown_text")
    out.amct_unknown_text.extend(keep)
    return out
