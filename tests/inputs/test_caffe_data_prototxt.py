"""Data layers as real train/test prototxts write them (LeNet on MNIST, CIFAR-10 with a mean
file, the SSD fork's AnnotatedData test layer), parsed by the model reader, read from
databases written as convert_mnist_data / convert_cifar_data / compute_image_mean write them."""
from __future__ import annotations

import cv2
import numpy as np

from amct_torch.caffe.netio import parse_prototxt
from amct_torch.inputs.caffe_data import open_data_layer
from amct_torch.proto import amct_caffe_pb2 as pb
from helpers.caffe_dbs import encoded_datum, raw_datum, sized_images, write_lmdb, write_mean

LENET = """
name: "LeNet"
layer {
  name: "mnist" type: "Data" top: "data" top: "label"
  include { phase: TRAIN }
  transform_param { scale: 0.00390625 }
  data_param { source: "mnist_train_lmdb" batch_size: 64 backend: LMDB }
}
layer {
  name: "mnist" type: "Data" top: "data" top: "label"
  include { phase: TEST }
  transform_param { scale: 0.00390625 }
  data_param { source: "mnist_test_lmdb" batch_size: 5 backend: LMDB }
}
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        inner_product_param { num_output: 10 } }
layer { name: "accuracy" type: "Accuracy" bottom: "ip" bottom: "label" top: "accuracy"
        include { phase: TEST } }
"""

CIFAR = """
name: "CIFAR10_quick"
layer {
  name: "cifar" type: "Data" top: "data" top: "label"
  include { phase: TEST }
  transform_param { mean_file: "mean.binaryproto" }
  data_param { source: "cifar10_test_lmdb" batch_size: 4 backend: LMDB }
}
"""

SSD = """
name: "VGG_VOC0712_SSD_300x300_test"
layer {
  name: "data" type: "AnnotatedData" top: "data" top: "label"
  include { phase: TEST }
  transform_param {
    mean_value: 104 mean_value: 117 mean_value: 123
    resize_param { prob: 1 resize_mode: WARP height: 60 width: 60 interp_mode: LINEAR }
  }
  data_param { source: "voc_test_lmdb" batch_size: 2 backend: LMDB }
  annotated_data_param { batch_sampler { } label_map_file: "labelmap_voc.prototxt" }
}
"""


def data_layer_of(net: pb.NetParameter) -> pb.LayerParameter:
    """The data layer of the TEST phase (the include rules of these nets are by phase only)."""
    return next(lay for lay in net.layer if lay.type.endswith("Data")
                and (not lay.include or lay.include[0].phase == pb.TEST))


def test_lenet_mnist(tmp_path):
    from sklearn.datasets import load_digits
    dg = load_digits()
    pix = [cv2.resize((im * 16).astype(np.uint8), (28, 28)) for im in dg.images[:7]]
    write_lmdb(str(tmp_path / "mnist_test_lmdb"),
               [(f"{i:08d}".encode(), raw_datum(p, int(dg.target[i])).SerializeToString())
                for i, p in enumerate(pix)])
    (tmp_path / "lenet.prototxt").write_text(LENET)
    net = parse_prototxt(str(tmp_path / "lenet.prototxt"))
    layer = data_layer_of(net)
    assert layer.data_param.source == "mnist_test_lmdb"
    with open_data_layer(layer, base_dir=str(tmp_path)) as src:
        assert src.top_shapes() == [(5, 1, 28, 28), (5,)] and src.num_samples == 7
        it = src.batches()
        a, b = next(it), next(it)
    assert np.array_equal(a["data"][:, 0], np.stack(pix[:5]) * np.float32(0.00390625))
    assert b["label"].tolist() == [float(dg.target[i]) for i in (5, 6, 0, 1, 2)]


def test_cifar_with_mean_file(tmp_path):
    rng = np.random.default_rng(3)
    pix = [rng.integers(0, 256, (32, 32, 3), dtype=np.uint8) for _ in range(6)]
    write_lmdb(str(tmp_path / "cifar10_test_lmdb"),
               [(f"{i:05d}".encode(), raw_datum(p, i % 10).SerializeToString())
                for i, p in enumerate(pix)])
    mean = np.mean([p.transpose(2, 0, 1).astype(np.float64) for p in pix], axis=0)
    write_mean(str(tmp_path / "mean.binaryproto"), mean.astype(np.float32))
    (tmp_path / "cifar.prototxt").write_text(CIFAR)
    layer = parse_prototxt(str(tmp_path / "cifar.prototxt")).layer[0]
    with open_data_layer(layer, base_dir=str(tmp_path)) as src:
        batch = next(src.batches(start=1))  # items 4, 5, 0, 1
    for k, i in enumerate([4, 5, 0, 1]):
        want = pix[i].transpose(2, 0, 1).astype(np.float32) - mean.astype(np.float32)
        assert np.array_equal(batch["data"][k], want)


def test_ssd_annotated_data_test_layer(tmp_path):
    imgs = sized_images(2, (75, 100))
    recs = []
    for i, im in enumerate(imgs):
        a = pb.AnnotatedDatum(type=pb.AnnotatedDatum.BBOX)
        a.datum.CopyFrom(encoded_datum(im, -1))
        box = a.annotation_group.add(group_label=7).annotation.add(instance_id=i).bbox
        box.xmin, box.ymin, box.xmax, box.ymax = 0.25, 0.25, 0.75, 1.0
        recs.append((f"{i:08d}_voc/{i}.jpg".encode(), a.SerializeToString()))
    write_lmdb(str(tmp_path / "voc_test_lmdb"), recs)
    (tmp_path / "test.prototxt").write_text(SSD)
    layer = parse_prototxt(str(tmp_path / "test.prototxt")).layer[0]
    assert len(layer.annotated_data_param.batch_sampler) == 1
    with open_data_layer(layer, base_dir=str(tmp_path)) as src:
        batch = next(src.batches())
    dec = cv2.imdecode(np.frombuffer(encoded_datum(imgs[1], 0).data, np.uint8), -1)
    want = cv2.resize(dec, (60, 60)).transpose(2, 0, 1).astype(np.float32) \
        - np.array([104, 117, 123], np.float32)[:, None, None]
    assert np.array_equal(batch["data"][1], want)
    assert batch["label"].reshape(-1, 8)[:, :3].tolist() == [[0, 7, 0], [1, 7, 1]]
