"""Train the bundled example model and write it as Caffe files with our own writer.

Why: the main job (calibrate + quantize a Caffe model) must run on a fresh clone with no
download, so the package ships a small real Caffe model and real data. This script is how
that model was made; rerun it to regenerate ``amct_torch/data/example/``:

    .venv/bin/python scripts/train_example.py

It trains a LeNet-style net (Convolution+BatchNorm+Scale+ReLU blocks, MAX and AVE Pooling, a
residual Eltwise SUM, two InnerProduct layers, Softmax) on ``sklearn.datasets.load_digits``
on the CPU with fixed seeds (well under a minute), writes the Caffe prototxt + caffemodel with
``amct_torch.caffe.netio.write_net``, saves the calibration and held-out test splits, then
checks the written files: our ``load_caffe`` and OpenCV's Caffe importer must agree with the
torch training model. It prints one JSON line with the figures (float test accuracy, sizes).

Preprocessing (what the saved ``.npz`` inputs already have applied, and what the model
expects): the 8x8 digit image (pixel values 0..16) divided by 16, then upsampled to 16x16 by
repeating every pixel 2x2 (nearest neighbour); float32, NCHW with one channel.
"""
from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from amct_torch.caffe.graph import load_caffe  # noqa: E402
from amct_torch.caffe.netio import write_net  # noqa: E402
from amct_torch.proto import amct_caffe_pb2 as pb  # noqa: E402

OUT_DIR = os.path.join(ROOT, "amct_torch", "data", "example")
PROTOTXT = "lenet_digits.prototxt"
CAFFEMODEL = "lenet_digits.caffemodel"
SEED = 0
SIDE = 16
WIDTH = 16          # channels of the conv blocks
HIDDEN = 32         # units of the first InnerProduct
EPOCHS = 40
BATCH = 64


def preprocess(images: np.ndarray) -> np.ndarray:
    """(N, 8, 8) digits with values 0..16 -> (N, 1, 16, 16) float32: /16, 2x2 nearest upsample."""
    x = images.astype(np.float32) / 16.0
    x = x.repeat(2, axis=1).repeat(2, axis=2)
    return np.ascontiguousarray(x[:, None, :, :], dtype=np.float32)


def split_digits() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """load_digits shuffled with a fixed seed, split 60 / 10 / 30 into train / calib / test."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = preprocess(digits.images)
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(SEED).permutation(len(y))
    n_train = int(round(0.6 * len(y)))
    n_calib = int(round(0.1 * len(y)))
    parts = {"train": order[:n_train], "calib": order[n_train:n_train + n_calib],
             "test": order[n_train + n_calib:]}
    return {k: (x[idx], y[idx]) for k, idx in parts.items()}


class Block(nn.Module):
    """Convolution (bias) + BatchNorm without affine (Caffe's BatchNorm) + per-channel affine
    (Caffe's Scale with bias_term); the ReLU is applied by the caller so the residual branch
    can add before it."""

    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, 3, padding=1)
        self.bn = nn.BatchNorm2d(c_out, eps=1e-5, affine=False)
        self.gamma = nn.Parameter(torch.ones(c_out))
        self.beta = nn.Parameter(torch.zeros(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn(self.conv(x))
        return y * self.gamma[None, :, None, None] + self.beta[None, :, None, None]


class LeNetDigits(nn.Module):
    """The torch twin of the Caffe net written by ``to_caffe`` (same layers, same order)."""

    def __init__(self) -> None:
        super().__init__()
        self.b1 = Block(1, WIDTH)
        self.b2 = Block(WIDTH, WIDTH)
        self.b3 = Block(WIDTH, WIDTH)
        self.fc1 = nn.Linear(WIDTH * (SIDE // 4) ** 2, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, 10)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        p1 = F.max_pool2d(F.relu(self.b1(x)), 2, 2)             # conv1..relu1, pool1 (MAX)
        r = self.b3(F.relu(self.b2(p1)))                          # conv2..relu2, conv3..scale3
        a = F.relu(p1 + r)                                        # res_add (SUM), relu_add
        p2 = F.avg_pool2d(a, 2, 2)                                # pool2 (AVE)
        h = F.relu(self.fc1(p2.flatten(1)))                       # fc1, relu_fc1
        return self.fc2(h)                                        # fc2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.softmax(self.logits(x), dim=1)                   # prob


def train(model: LeNetDigits, x: np.ndarray, y: np.ndarray) -> None:
    """Adam with a cosine schedule, fixed shuffling seed; CPU, deterministic."""
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=EPOCHS)
    gen = torch.Generator().manual_seed(SEED)
    model.train()
    for _ in range(EPOCHS):
        perm = torch.randperm(len(yt), generator=gen)
        for i in range(0, len(yt), BATCH):
            idx = perm[i:i + BATCH]
            if len(idx) < 2:  # BatchNorm needs more than one sample
                continue
            loss = F.cross_entropy(model.logits(xt[idx]), yt[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        sched.step()
    model.eval()


def _blob(layer: pb.LayerParameter, arr: torch.Tensor | np.ndarray) -> None:
    """Append a float32 blob with ``shape`` dims (the form the writer and OpenCV expect)."""
    a = np.asarray(arr.detach().cpu().numpy() if isinstance(arr, torch.Tensor) else arr,
                   dtype=np.float32)
    blob = layer.blobs.add()
    blob.shape.dim.extend(int(d) for d in a.shape)
    blob.data.extend(a.reshape(-1).tolist())


def _layer(net: pb.NetParameter, name: str, type_: str, bottoms: list[str],
           tops: list[str]) -> pb.LayerParameter:
    layer = net.layer.add()
    layer.name, layer.type = name, type_
    layer.bottom.extend(bottoms)
    layer.top.extend(tops)
    return layer


def _conv_block(net: pb.NetParameter, block: Block, idx: int, bottom: str, relu: bool) -> str:
    """Convolution + BatchNorm + Scale (+ ReLU), BN/Scale/ReLU in place as in usual Caffe nets."""
    top = f"conv{idx}"
    conv = _layer(net, top, "Convolution", [bottom], [top])
    cp = conv.convolution_param
    cp.num_output = block.conv.out_channels
    cp.kernel_size.append(3)
    cp.pad.append(1)
    cp.stride.append(1)
    _blob(conv, block.conv.weight)
    _blob(conv, block.conv.bias)
    bn = _layer(net, f"bn{idx}", "BatchNorm", [top], [top])
    bn.batch_norm_param.use_global_stats = True
    bn.batch_norm_param.eps = block.bn.eps
    _blob(bn, block.bn.running_mean)   # mean * s with s = 1
    _blob(bn, block.bn.running_var)    # var * s
    _blob(bn, np.ones(1, np.float32))  # s
    sc = _layer(net, f"scale{idx}", "Scale", [top], [top])
    sc.scale_param.bias_term = True
    _blob(sc, block.gamma)
    _blob(sc, block.beta)
    if relu:
        _layer(net, f"relu{idx}", "ReLU", [top], [top])
    return top


def to_caffe(model: LeNetDigits) -> pb.NetParameter:
    """The trained model as a deploy NetParameter with blobs (new ``layer`` format)."""
    net = pb.NetParameter()
    net.name = "lenet_digits"
    inp = _layer(net, "data", "Input", [], ["data"])
    inp.input_param.shape.add().dim.extend([1, 1, SIDE, SIDE])
    c1 = _conv_block(net, model.b1, 1, "data", relu=True)
    pool1 = _layer(net, "pool1", "Pooling", [c1], ["pool1"])
    pool1.pooling_param.pool = pb.PoolingParameter.MAX
    pool1.pooling_param.kernel_size = 2
    pool1.pooling_param.stride = 2
    c2 = _conv_block(net, model.b2, 2, "pool1", relu=True)
    c3 = _conv_block(net, model.b3, 3, c2, relu=False)
    add = _layer(net, "res_add", "Eltwise", ["pool1", c3], ["res_add"])
    add.eltwise_param.operation = pb.EltwiseParameter.SUM
    _layer(net, "relu_add", "ReLU", ["res_add"], ["res_add"])
    pool2 = _layer(net, "pool2", "Pooling", ["res_add"], ["pool2"])
    pool2.pooling_param.pool = pb.PoolingParameter.AVE
    pool2.pooling_param.kernel_size = 2
    pool2.pooling_param.stride = 2
    fc1 = _layer(net, "fc1", "InnerProduct", ["pool2"], ["fc1"])
    fc1.inner_product_param.num_output = HIDDEN
    _blob(fc1, model.fc1.weight)
    _blob(fc1, model.fc1.bias)
    _layer(net, "relu_fc1", "ReLU", ["fc1"], ["fc1"])
    fc2 = _layer(net, "fc2", "InnerProduct", ["fc1"], ["fc2"])
    fc2.inner_product_param.num_output = 10
    _blob(fc2, model.fc2.weight)
    _blob(fc2, model.fc2.bias)
    _layer(net, "prob", "Softmax", ["fc2"], ["prob"])
    return net


def _opencv_prob(prototxt: str, caffemodel: str, x: np.ndarray) -> np.ndarray:
    """Softmax outputs of OpenCV's Caffe importer, one sample at a time (declared batch 1)."""
    import cv2

    dnn = cv2.dnn.readNetFromCaffe(prototxt, caffemodel)
    out = []
    for sample in x:
        dnn.setInput(sample[None])
        out.append(dnn.forward("prob").reshape(-1))
    return np.stack(out)


def verify(model: LeNetDigits, splits: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict:
    """Load the written files with our loader and with OpenCV; compare all three on the test
    split and return the figures."""
    prototxt, caffemodel = (os.path.join(OUT_DIR, PROTOTXT), os.path.join(OUT_DIR, CAFFEMODEL))
    x, y = splits["test"]
    with torch.no_grad():
        ours_torch = model(torch.from_numpy(x)).numpy()
        gm = load_caffe(prototxt, caffemodel)
        ours_caffe = gm(torch.from_numpy(x))["prob"].numpy()
    cv = _opencv_prob(prototxt, caffemodel, x)
    figures = {
        "float_test_accuracy": float((ours_caffe.argmax(1) == y).mean()),
        "torch_test_accuracy": float((ours_torch.argmax(1) == y).mean()),
        "max_abs_diff_loader_vs_torch": float(np.abs(ours_caffe - ours_torch).max()),
        "max_abs_diff_loader_vs_opencv": float(np.abs(ours_caffe - cv).max()),
        "same_predictions_torch_loader_opencv": bool(
            (ours_torch.argmax(1) == ours_caffe.argmax(1)).all()
            and (cv.argmax(1) == ours_caffe.argmax(1)).all()),
    }
    if not figures["same_predictions_torch_loader_opencv"] or \
            figures["max_abs_diff_loader_vs_opencv"] > 1e-4 or \
            figures["max_abs_diff_loader_vs_torch"] > 1e-4:
        raise SystemExit(f"verification failed: {figures}")
    return figures


def main() -> None:
    """Train, write, verify, print one JSON line of figures."""
    start = time.time()
    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)
    splits = split_digits()
    model = LeNetDigits()
    train(model, *splits["train"])
    os.makedirs(OUT_DIR, exist_ok=True)
    write_net(to_caffe(model), os.path.join(OUT_DIR, PROTOTXT), os.path.join(OUT_DIR, CAFFEMODEL))
    for name in ("calib", "test"):
        x, y = splits[name]
        np.savez_compressed(os.path.join(OUT_DIR, f"digits_{name}.npz"), inputs=x,
                            labels=y.astype(np.int64))
    figures = verify(model, splits)
    figures.update({
        "shapes": {k: list(v[0].shape) for k, v in splits.items()},
        "bytes": {f: os.path.getsize(os.path.join(OUT_DIR, f))
                  for f in sorted(os.listdir(OUT_DIR))},
        "seconds": round(time.time() - start, 1),
    })
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
