"""A ~300-layer SSD-style detector built by code: a stem, four stages of residual bottleneck
blocks (1×1, 3×3, 1×1 convolutions and an Eltwise sum), a strided convolution between
stages, and a location and a confidence head per stage -- the layer count of a real detector
at a small size (64×64 input, 16-32 channels), with seeded random weights."""
from __future__ import annotations

import os

import numpy as np

from amct_torch.caffe.netio import write_net
from amct_torch.proto import amct_caffe_pb2 as pb

ANCHORS, CLASSES = 4, 5


def detector_net(folder: str, blocks: int = 24, size: int = 64, seed: int = 0) -> tuple[str, str]:
    """Write ``detector.prototxt`` / ``.caffemodel`` with ``4 * (3 * blocks + 3)`` + 1
    convolutions (301 for 24 blocks a stage); returns both paths."""
    rng = np.random.default_rng(seed)
    net = pb.NetParameter(name="detector")
    inp = net.layer.add(name="data", type="Input", top=["data"])
    inp.input_param.shape.add(dim=[1, 3, size, size])

    def conv(name: str, bottom: str, cin: int, cout: int, k: int, stride: int = 1, relu: bool = True,
             gain: float = 1.0) -> str:
        layer = net.layer.add(name=name, type="Convolution", bottom=[bottom], top=[name])
        p = layer.convolution_param
        p.num_output, p.stride[:], p.pad[:], p.kernel_size[:] = cout, [stride], [k // 2], [k]
        w = rng.standard_normal((cout, cin, k, k)).astype(np.float32) * gain * np.sqrt(2.0 / (cin * k * k))
        for arr in (w, rng.standard_normal(cout).astype(np.float32) * 0.05):
            blob = layer.blobs.add()
            blob.shape.dim.extend(arr.shape)
            blob.data.extend(arr.reshape(-1).tolist())
        if relu:
            net.layer.add(name=name + "_relu", type="ReLU", bottom=[name], top=[name])
        return name

    top, ch = conv("stem", "data", 3, 16, 3, stride=2), 16
    for s in range(4):
        out = 16 if s < 2 else 32
        top, ch = conv(f"down{s}", top, ch, out, 3, stride=2 if s else 1), out
        for b in range(blocks):
            n = f"s{s}b{b}"
            a = conv(n + "_expand", top, ch, ch * 2, 1)
            a = conv(n + "_dw", a, ch * 2, ch * 2, 3)
            a = conv(n + "_project", a, ch * 2, ch, 1, relu=False, gain=0.2)
            add = net.layer.add(name=n + "_add", type="Eltwise", bottom=[top, a], top=[n + "_add"])
            add.eltwise_param.operation = pb.EltwiseParameter.SUM
            top = n + "_add"
        conv(f"loc{s}", top, ch, 4 * ANCHORS, 3, relu=False)
        conv(f"conf{s}", top, ch, CLASSES * ANCHORS, 3, relu=False)
    proto, model = os.path.join(folder, "detector.prototxt"), os.path.join(folder, "detector.caffemodel")
    write_net(net, proto, model)
    return proto, model
