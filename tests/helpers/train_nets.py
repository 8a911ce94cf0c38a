"""Caffe train/test nets for the tests: the real BVLC prototxts (LeNet's
``examples/mnist/lenet_train_test.prototxt``, ``examples/cifar10/cifar10_quick_train_test.prototxt``)
and a small ImageNet-style train_val (mean_file, crop_size, top-1/top-5 accuracy), their
weights built by code, and databases written the way Caffe's tools write them (LMDB, one
``Datum`` per image under a zero-padded key, ``mean.binaryproto`` a BlobProto)."""
from __future__ import annotations

import os
from typing import Optional, Sequence

import numpy as np

#: BVLC Caffe examples/mnist/lenet_train_test.prototxt, as published
LENET_TRAIN_TEST = """\
name: "LeNet"
layer {
  name: "mnist"
  type: "Data"
  top: "data"
  top: "label"
  include {
    phase: TRAIN
  }
  transform_param {
    scale: 0.00390625
  }
  data_param {
    source: "examples/mnist/mnist_train_lmdb"
    batch_size: 64
    backend: LMDB
  }
}
layer {
  name: "mnist"
  type: "Data"
  top: "data"
  top: "label"
  include {
    phase: TEST
  }
  transform_param {
    scale: 0.00390625
  }
  data_param {
    source: "examples/mnist/mnist_test_lmdb"
    batch_size: 100
    backend: LMDB
  }
}
layer {
  name: "conv1"
  type: "Convolution"
  bottom: "data"
  top: "conv1"
  param {
    lr_mult: 1
  }
  param {
    lr_mult: 2
  }
  convolution_param {
    num_output: 20
    kernel_size: 5
    stride: 1
    weight_filler {
      type: "xavier"
    }
    bias_filler {
      type: "constant"
    }
  }
}
layer {
  name: "pool1"
  type: "Pooling"
  bottom: "conv1"
  top: "pool1"
  pooling_param {
    pool: MAX
    kernel_size: 2
    stride: 2
  }
}
layer {
  name: "conv2"
  type: "Convolution"
  bottom: "pool1"
  top: "conv2"
  param {
    lr_mult: 1
  }
  param {
    lr_mult: 2
  }
  convolution_param {
    num_output: 50
    kernel_size: 5
    stride: 1
    weight_filler {
      type: "xavier"
    }
    bias_filler {
      type: "constant"
    }
  }
}
layer {
  name: "pool2"
  type: "Pooling"
  bottom: "conv2"
  top: "pool2"
  pooling_param {
    pool: MAX
    kernel_size: 2
    stride: 2
  }
}
layer {
  name: "ip1"
  type: "InnerProduct"
  bottom: "pool2"
  top: "ip1"
  param {
    lr_mult: 1
  }
  param {
    lr_mult: 2
  }
  inner_product_param {
    num_output: 500
    weight_filler {
      type: "xavier"
    }
    bias_filler {
      type: "constant"
    }
  }
}
layer {
  name: "relu1"
  type: "ReLU"
  bottom: "ip1"
  top: "ip1"
}
layer {
  name: "ip2"
  type: "InnerProduct"
  bottom: "ip1"
  top: "ip2"
  param {
    lr_mult: 1
  }
  param {
    lr_mult: 2
  }
  inner_product_param {
    num_output: 10
    weight_filler {
      type: "xavier"
    }
    bias_filler {
      type: "constant"
    }
  }
}
layer {
  name: "accuracy"
  type: "Accuracy"
  bottom: "ip2"
  bottom: "label"
  top: "accuracy"
  include {
    phase: TEST
  }
}
layer {
  name: "loss"
  type: "SoftmaxWithLoss"
  bottom: "ip2"
  bottom: "label"
  top: "loss"
}
"""

#: BVLC Caffe examples/cifar10/cifar10_quick_train_test.prototxt, as published
CIFAR10_QUICK_TRAIN_TEST = """\
name: "CIFAR10_quick"
layer {
  name: "cifar"
  type: "Data"
  top: "data"
  top: "label"
  include {
    phase: TRAIN
  }
  transform_param {
    mean_file: "examples/cifar10/mean.binaryproto"
  }
  data_param {
    source: "examples/cifar10/cifar10_train_lmdb"
    batch_size: 100
    backend: LMDB
  }
}
layer {
  name: "cifar"
  type: "Data"
  top: "data"
  top: "label"
  include {
    phase: TEST
  }
  transform_param {
    mean_file: "examples/cifar10/mean.binaryproto"
  }
  data_param {
    source: "examples/cifar10/cifar10_test_lmdb"
    batch_size: 100
    backend: LMDB
  }
}
layer {
  name: "conv1"
  type: "Convolution"
  bottom: "data"
  top: "conv1"
  param {
    lr_mult: 1
  }
  param {
    lr_mult: 2
  }
  convolution_param {
    num_output: 32
    pad: 2
    kernel_size: 5
    stride: 1
    weight_filler {
      type: "gaussian"
      std: 0.0001
    }
    bias_filler {
      type: "constant"
    }
  }
}
layer {
  name: "pool1"
  type: "Pooling"
  bottom: "conv1"
  top: "pool1"
  pooling_param {
    pool: MAX
    kernel_size: 3
    stride: 2
  }
}
layer {
  name: "relu1"
  type: "ReLU"
  bottom: "pool1"
  top: "pool1"
}
layer {
  name: "conv2"
  type: "Convolution"
  bottom: "pool1"
  top: "conv2"
  param {
    lr_mult: 1
  }
  param {
    lr_mult: 2
  }
  convolution_param {
    num_output: 32
    pad: 2
    kernel_size: 5
    stride: 1
    weight_filler {
      type: "gaussian"
      std: 0.01
    }
    bias_filler {
      type: "constant"
    }
  }
}
layer {
  name: "relu2"
  type: "ReLU"
  bottom: "conv2"
  top: "conv2"
}
layer {
  name: "pool2"
  type: "Pooling"
  bottom: "conv2"
  top: "pool2"
  pooling_param {
    pool: AVE
    kernel_size: 3
    stride: 2
  }
}
layer {
  name: "conv3"
  type: "Convolution"
  bottom: "pool2"
  top: "conv3"
  param {
    lr_mult: 1
  }
  param {
    lr_mult: 2
  }
  convolution_param {
    num_output: 64
    pad: 2
    kernel_size: 5
    stride: 1
    weight_filler {
      type: "gaussian"
      std: 0.01
    }
    bias_filler {
      type: "constant"
    }
  }
}
layer {
  name: "relu3"
  type: "ReLU"
  bottom: "conv3"
  top: "conv3"
}
layer {
  name: "pool3"
  type: "Pooling"
  bottom: "conv3"
  top: "pool3"
  pooling_param {
    pool: AVE
    kernel_size: 3
    stride: 2
  }
}
layer {
  name: "ip1"
  type: "InnerProduct"
  bottom: "pool3"
  top: "ip1"
  param {
    lr_mult: 1
  }
  param {
    lr_mult: 2
  }
  inner_product_param {
    num_output: 64
    weight_filler {
      type: "gaussian"
      std: 0.1
    }
    bias_filler {
      type: "constant"
    }
  }
}
layer {
  name: "ip2"
  type: "InnerProduct"
  bottom: "ip1"
  top: "ip2"
  param {
    lr_mult: 1
  }
  param {
    lr_mult: 2
  }
  inner_product_param {
    num_output: 10
    weight_filler {
      type: "gaussian"
      std: 0.1
    }
    bias_filler {
      type: "constant"
    }
  }
}
layer {
  name: "accuracy"
  type: "Accuracy"
  bottom: "ip2"
  bottom: "label"
  top: "accuracy"
  include {
    phase: TEST
  }
}
layer {
  name: "loss"
  type: "SoftmaxWithLoss"
  bottom: "ip2"
  bottom: "label"
  top: "loss"
}
"""

#: a small ImageNet-style train_val in CaffeNet's form: a Data layer per phase with
#: ``mean_file`` and ``crop_size``, SoftmaxWithLoss, top-1 and top-5 Accuracy in TEST only
IMAGENET_STYLE_TRAIN_VAL = """\
name: "MiniCaffeNet"
layer {
  name: "data" type: "Data" top: "data" top: "label"
  include { phase: TRAIN }
  transform_param { mirror: true crop_size: 24 mean_file: "data/imagenet_mean.binaryproto" }
  data_param { source: "examples/imagenet/train_lmdb" batch_size: 16 backend: LMDB }
}
layer {
  name: "data" type: "Data" top: "data" top: "label"
  include { phase: TEST }
  transform_param { mirror: false crop_size: 24 mean_file: "data/imagenet_mean.binaryproto" }
  data_param { source: "examples/imagenet/val_lmdb" batch_size: 10 backend: LMDB }
}
layer {
  name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  convolution_param { num_output: 8 kernel_size: 5 stride: 1 }
}
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer {
  name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
  pooling_param { pool: MAX kernel_size: 3 stride: 2 }
}
layer {
  name: "fc8" type: "InnerProduct" bottom: "pool1" top: "fc8"
  inner_product_param { num_output: 10 }
}
layer {
  name: "accuracy" type: "Accuracy" bottom: "fc8" bottom: "label" top: "accuracy"
  include { phase: TEST }
}
layer {
  name: "accuracy_top5" type: "Accuracy" bottom: "fc8" bottom: "label" top: "accuracy_top5"
  include { phase: TEST }
  accuracy_param { top_k: 5 }
}
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc8" bottom: "label" top: "loss" }
"""


def _varint(v: int) -> bytes:
    out = bytearray()
    v &= (1 << 64) - 1
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def datum_bytes(pixels: Optional[np.ndarray] = None, label: int = 0, *, encoded: Optional[bytes] = None,
                channels: int = 0, height: int = 0, width: int = 0) -> bytes:
    """A serialized caffe.Datum written field by field (channels 1, height 2, width 3, data 4,
    label 5, encoded 7): raw uint8 CHW ``pixels``, or ``encoded`` image bytes (JPEG/PNG) as
    ``convert_imageset --encoded`` writes them."""
    if pixels is not None:
        channels, height, width = pixels.shape
        data = np.ascontiguousarray(pixels, np.uint8).tobytes()
    else:
        assert encoded is not None
        data = encoded
    out = b"\x08" + _varint(channels) + b"\x10" + _varint(height) + b"\x18" + _varint(width)
    out += b"\x22" + _varint(len(data)) + data + b"\x28" + _varint(label)
    if encoded is not None:
        out += b"\x38\x01"
    return out


def write_lmdb(path: str, records: Sequence[bytes]) -> None:
    """An LMDB of serialized Datums under Caffe's keys (``%08d``, in order), as
    convert_mnist_data / convert_cifar_data write them."""
    import lmdb

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    env = lmdb.open(path, map_size=1 << 30)
    with env.begin(write=True) as txn:
        for i, rec in enumerate(records):
            txn.put(b"%08d" % i, rec)
    env.close()


def write_mean_binaryproto(path: str, mean: np.ndarray) -> None:
    """``mean`` (C, H, W) as compute_image_mean writes it: a BlobProto with num 1, channels,
    height, width (fields 1-4) and the packed float data (field 5)."""
    c, h, w = mean.shape
    raw = np.ascontiguousarray(mean, "<f4").tobytes()
    body = b"\x08\x01\x10" + _varint(c) + b"\x18" + _varint(h) + b"\x20" + _varint(w)
    body += b"\x2a" + _varint(len(raw)) + raw
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "wb") as f:
        f.write(body)


def random_weights(prototxt: str, caffemodel: str, seed: int = 0, std: float = 0.1) -> None:
    """A caffemodel for ``prototxt`` (its TEST data must exist: the shapes come from it) with
    Gaussian weights of standard deviation ``std`` and biases 0.1 x Gaussian."""
    import torch

    from amct_torch.caffe.graph import load_caffe
    from amct_torch.caffe.netio import save_caffe

    gm = load_caffe(prototxt)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in gm.state_dict().items():
            scale = std if name.endswith("weight") else 0.1 * std
            t.copy_(torch.randn(t.shape, generator=g) * scale)
    save_caffe(gm, caffemodel + ".prototxt", caffemodel)
    os.remove(caffemodel + ".prototxt")


def digits_lmdb(path: str, count: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """An MNIST-like LMDB (1x28x28 uint8 images, labels 0-9) at ``path``: (images, labels)."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(count, 1, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, size=count)
    write_lmdb(path, [datum_bytes(im, int(lab)) for im, lab in zip(images, labels)])
    return images, labels
