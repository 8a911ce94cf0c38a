"""Data layers over LMDB / LevelDB databases written as convert_imageset and
convert_cifar_data write them, against a reference computed plainly here: Caffe's TEST
transform is a centre crop at ((H - crop) // 2, (W - crop) // 2), then (pixel - mean) * scale
in float32, the mean file cropped at the same offsets."""
from __future__ import annotations

import cv2
import numpy as np
import pytest

from amct_torch.inputs.caffe_data import is_data_layer, open_data_layer, read_mean_file
from amct_torch.proto import amct_caffe_pb2 as pb
from helpers.caffe_dbs import (
    data_layer,
    encoded_datum,
    imageset_records,
    raw_datum,
    sized_images,
    write_leveldb,
    write_lmdb,
    write_mean,
)


def reference(img_chw: np.ndarray, crop: int, mean: np.ndarray, scale: float) -> np.ndarray:
    """Centre crop, subtract the (cropped) mean, scale: one image, written out plainly."""
    c, h, w = img_chw.shape
    top, left = (h - crop) // 2, (w - crop) // 2
    x = img_chw[:, top:top + crop, left:left + crop].astype(np.float32)
    m = mean if mean.shape[1:] == (1, 1) else mean[:, top:top + crop, left:left + crop]
    return (x - m) * np.float32(scale)


@pytest.fixture(scope="module")
def raw_db(tmp_path_factory):
    d = tmp_path_factory.mktemp("raw")
    imgs = sized_images(10, (61, 79))  # odd margins: the offsets round down
    write_lmdb(str(d / "lmdb"), imageset_records([raw_datum(im, 3 * i) for i, im in enumerate(imgs)]))
    mean = np.random.default_rng(1).uniform(0, 255, (3, 61, 79)).astype(np.float32)
    write_mean(str(d / "mean.binaryproto"), mean)
    return d, imgs, mean


def test_raw_lmdb_mean_file_crop_scale_and_wrap_round(raw_db):
    d, imgs, mean = raw_db
    layer = data_layer("lmdb", 4, crop_size=48, mean_file="mean.binaryproto", scale=0.00390625)
    with open_data_layer(layer, base_dir=str(d)) as src:
        assert src.tops == ("data", "label") and src.batch_size == 4 and src.num_samples == 10
        assert src.top_shapes() == [(4, 3, 48, 48), (4,)]
        it = src.batches()
        got = [next(it) for _ in range(3)]  # 12 items from 10 records: wraps to the first
        later = next(src.batches(start=2))
    order = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1]
    data = np.concatenate([b["data"] for b in got])
    labels = np.concatenate([b["label"] for b in got])
    for k, i in enumerate(order):
        ref = reference(imgs[i].transpose(2, 0, 1), 48, mean, 0.00390625)
        assert np.array_equal(data[k], ref), k
    assert labels.tolist() == [3.0 * i for i in order] and labels.dtype == np.float32
    assert np.array_equal(later["data"], got[2]["data"])


def test_old_nets_transform_fields_in_data_param(raw_db):
    """Old nets give scale / mean_file / crop_size in data_param; Caffe's upgrade moves them."""
    d, imgs, mean = raw_db
    layer = data_layer("lmdb", 2)
    layer.data_param.crop_size, layer.data_param.scale = 32, 0.25
    layer.data_param.mean_file = "mean.binaryproto"
    with open_data_layer(layer, base_dir=str(d)) as src:
        got = next(src.batches())["data"]
    assert np.array_equal(got[1], reference(imgs[1].transpose(2, 0, 1), 32, mean, 0.25))


def test_mean_file_read_as_written(raw_db):
    d, _, mean = raw_db
    assert np.array_equal(read_mean_file(str(d / "mean.binaryproto")), mean)
    write_mean(str(d / "mean_shape.binaryproto"), mean, legacy=False)
    assert np.array_equal(read_mean_file(str(d / "mean_shape.binaryproto")), mean)


def test_leveldb_gives_what_lmdb_gives(raw_db, tmp_path):
    d, imgs, _ = raw_db
    write_leveldb(str(tmp_path / "ldb"),
                  imageset_records([raw_datum(im, 3 * i) for i, im in enumerate(imgs)]))
    kw = dict(crop_size=40, mean_value=[104.0, 117.0, 123.0])
    with open_data_layer(data_layer(str(d / "lmdb"), 3, **kw), base_dir=str(tmp_path)) as a, \
            open_data_layer(data_layer("ldb", 3, backend="LEVELDB", **kw),
                            base_dir=str(tmp_path)) as b:
        assert b.num_samples == 10
        for x, y in zip(a.batches(), b.batches(start=0)):
            assert np.array_equal(x["data"], y["data"]) and np.array_equal(x["label"], y["label"])
            break
        ref = reference(imgs[0].transpose(2, 0, 1), 40,
                        np.array([104, 117, 123], np.float32)[:, None, None], 1.0)
        assert np.array_equal(next(b.batches())["data"][0], ref)


@pytest.mark.parametrize("ext", [".jpg", ".png"])
def test_encoded_images_decode_as_opencv_does(tmp_path, ext):
    imgs = sized_images(6, (40, 52))
    datums = [encoded_datum(im, i, ext) for i, im in enumerate(imgs)]
    write_lmdb(str(tmp_path / "db"), imageset_records(datums))
    layer = data_layer("db", 6, crop_size=32, mean_value=[100.0, 110.0, 120.0], scale=0.017)
    with open_data_layer(layer, base_dir=str(tmp_path)) as src:
        batch = next(src.batches())
    for i, d in enumerate(datums):
        dec = cv2.imdecode(np.frombuffer(d.data, np.uint8), cv2.IMREAD_UNCHANGED)
        ref = reference(dec.transpose(2, 0, 1), 32,
                        np.array([100, 110, 120], np.float32)[:, None, None], 0.017)
        assert np.array_equal(batch["data"][i], ref)
    assert batch["label"].tolist() == list(range(6))


def test_force_gray_and_grey_images_stored_encoded(tmp_path):
    imgs = sized_images(2, (30, 30))
    grey = [cv2.cvtColor(im, cv2.COLOR_BGR2GRAY) for im in imgs]
    write_lmdb(str(tmp_path / "colour"), imageset_records([encoded_datum(im, 0) for im in imgs]))
    write_lmdb(str(tmp_path / "grey"), imageset_records([encoded_datum(g, 0, ".png") for g in grey]))
    with open_data_layer(data_layer("colour", 2, force_gray=True), base_dir=str(tmp_path)) as src:
        assert src.top_shapes()[0] == (2, 1, 30, 30)
        got = next(src.batches())["data"]
        buf = encoded_datum(imgs[1], 0).data
        assert np.array_equal(got[1, 0], cv2.imdecode(np.frombuffer(buf, np.uint8),
                                                      cv2.IMREAD_GRAYSCALE).astype(np.float32))
    with open_data_layer(data_layer("grey", 2, tops=("data",)), base_dir=str(tmp_path)) as src:
        assert src.tops == ("data",) and src.top_shapes() == [(2, 1, 30, 30)]
        assert np.array_equal(next(src.batches())["data"][0, 0], grey[0].astype(np.float32))
    with open_data_layer(data_layer("grey", 2, force_color=True), base_dir=str(tmp_path)) as src:
        got = next(src.batches())["data"]
        assert got.shape == (2, 3, 30, 30)
        assert all(np.array_equal(got[0, c], grey[0].astype(np.float32)) for c in range(3))


def test_cifar_style_raw_records_and_float_data(tmp_path):
    """convert_cifar_data: raw 3×32×32 Datums keyed %05d; float_data records read as floats."""
    from sklearn.datasets import load_digits
    digits = load_digits()
    rng = np.random.default_rng(0)
    pix = [rng.integers(0, 256, (32, 32, 3), dtype=np.uint8) for _ in range(5)]
    write_lmdb(str(tmp_path / "cifar"),
               [(f"{i:05d}".encode(), raw_datum(p, i).SerializeToString())
                for i, p in enumerate(pix)])
    with open_data_layer(data_layer("cifar", 5, scale=0.5), base_dir=str(tmp_path)) as src:
        b = next(src.batches())
    assert np.array_equal(b["data"], np.stack([p.transpose(2, 0, 1) for p in pix]) * np.float32(0.5))
    floats = []
    for i in range(4):
        d = pb.Datum(channels=1, height=8, width=8, label=int(digits.target[i]))
        d.float_data.extend(digits.images[i].ravel().tolist())
        floats.append((f"{i:05d}".encode(), d.SerializeToString()))
    write_lmdb(str(tmp_path / "digits"), floats)
    with open_data_layer(data_layer("digits", 4, mean_value=[8.0], scale=0.125),
                         base_dir=str(tmp_path)) as src:
        b = next(src.batches())
    ref = (digits.images[:4].astype(np.float32) - np.float32(8)) * np.float32(0.125)
    assert np.array_equal(b["data"][:, 0], ref)
    assert b["label"].tolist() == digits.target[:4].astype(float).tolist()


def test_data_layer_types():
    assert all(is_data_layer(t) for t in ("Data", "ImageData", "HDF5Data", "AnnotatedData",
                                          "DummyData", "MemoryData"))
    assert not any(is_data_layer(t) for t in ("Input", "Convolution", "Accuracy"))


def test_reading_data_layers_needs_no_torch():
    """The graph builder and the command ask about data layers before torch is needed."""
    import json
    import subprocess
    import sys
    code = ("import sys, json\nfrom amct_torch.inputs.caffe_data import is_data_layer\n"
            "assert is_data_layer('Data')\nprint(json.dumps('torch' in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) is False


def test_order_does_not_depend_on_the_threads(tmp_path):
    imgs = sized_images(9, (36, 36))
    write_lmdb(str(tmp_path / "db"), imageset_records([encoded_datum(im, i) for i, im in enumerate(imgs)]))
    runs = []
    for threads in (1, 4):
        with open_data_layer(data_layer("db", 2, crop_size=30), base_dir=str(tmp_path),
                             threads=threads) as src:
            it = src.batches()
            runs.append([next(it) for _ in range(6)])  # 12 items: wraps round once
    for a, b in zip(*runs):
        assert np.array_equal(a["data"], b["data"]) and np.array_equal(a["label"], b["label"])
    labels = np.concatenate([b["label"] for b in runs[0]]).tolist()
    assert labels == [float(i % 9) for i in range(12)]
