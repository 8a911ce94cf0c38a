"""Caffe train/test nets for the tests: the real BVLC prototxts (LeNet's
``examples/mnist/lenet_train_test.prototxt``, ``examples/cifar10/cifar10_quick_train_test.prototxt``)
and a small ImageNet-style train_val (mean_file, crop_size, top-1/top-5 accuracy), their
weights built by code, and databases written the way Caffe's tools write them (LMDB, one
``Datum`` per image under a zero-padded key, ``mean.binaryproto`` a BlobProto)."""
from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from helpers.caffe_dbs import raw_datum, write_lmdb

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
    """An MNIST-like LMDB (1x28x28 uint8 images, labels 0-9) at ``path`` as convert_mnist_data
    writes it (raw Datums under ``%08d`` keys): (images N x 1 x 28 x 28, labels)."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(count, 1, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, size=count)
    write_records(path, images, labels)
    return images, labels


def write_records(path: str, images: np.ndarray, labels: Sequence[int]) -> None:
    """An LMDB of raw Datums (``images`` N x C x H x W uint8) under ``%08d`` keys."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_lmdb(path, [(b"%08d" % i, raw_datum(im.transpose(1, 2, 0), int(lab)).SerializeToString())
                      for i, (im, lab) in enumerate(zip(images, labels))])
