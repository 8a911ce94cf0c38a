"""Bad Caffe data gets one DataError line naming the file and the key, line or layer."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from amct_torch.errors import DataError
from amct_torch.inputs.caffe_data import open_data_layer
from amct_torch.proto import amct_caffe_pb2 as pb
from helpers.caffe_dbs import (
    data_layer,
    encoded_datum,
    imageset_records,
    raw_datum,
    sized_images,
    write_h5,
    write_lmdb,
    write_mean,
)


def fails(layer: pb.LayerParameter, base: str, *needles: str) -> str:
    """The one-line message opening ``layer`` and reading a batch gives; it holds ``needles``."""
    with pytest.raises(DataError) as info, open_data_layer(layer, base_dir=base) as src:
        next(src.batches())
    msg = str(info.value)
    assert "\n" not in msg, msg
    for n in needles:
        assert n in msg, (n, msg)
    return msg


@pytest.fixture(scope="module")
def imgs():
    return sized_images(3, (20, 24))


def test_not_an_lmdb_and_truncated_and_empty(tmp_path, imgs):
    (tmp_path / "notdb").mkdir()
    (tmp_path / "notdb" / "readme.txt").write_text("hello")
    fails(data_layer("notdb", 2), str(tmp_path), "notdb", "not an LMDB", "layer 'data'")
    (tmp_path / "garbage").mkdir()
    (tmp_path / "garbage" / "data.mdb").write_bytes(b"\0" * 100)
    fails(data_layer("garbage", 2), str(tmp_path), "garbage", "LMDB")
    big = sized_images(40, (64, 64))
    write_lmdb(str(tmp_path / "cut"), imageset_records([raw_datum(im, 0) for im in big]))
    mdb = tmp_path / "cut" / "data.mdb"
    with open(mdb, "r+b") as f:
        f.truncate(os.path.getsize(mdb) // 3)
    fails(data_layer("cut", 2), str(tmp_path), "cut", "truncated")
    write_lmdb(str(tmp_path / "empty"), [])
    fails(data_layer("empty", 2), str(tmp_path), "empty", "empty")


def test_datum_byte_count_and_undecodable_image(tmp_path, imgs):
    bad = raw_datum(imgs[1], 0)
    bad.height = 21
    write_lmdb(str(tmp_path / "db"), imageset_records([raw_datum(imgs[0], 0), bad]))
    fails(data_layer("db", 2), str(tmp_path), "db", "00000001_img1.jpg", "1440", "3x21x24 = 1512", "layer")
    junk = pb.Datum(data=b"\xff\xd8\xff not really a jpeg", encoded=True)
    write_lmdb(str(tmp_path / "enc"), imageset_records([encoded_datum(imgs[0], 0), junk]))
    fails(data_layer("enc", 2), str(tmp_path), "enc", "00000001_img1.jpg", "cannot decode")
    write_lmdb(str(tmp_path / "notdatum"), [(b"k", b"\xff\xff\xff\xff")])
    fails(data_layer("notdatum", 1), str(tmp_path), "notdatum", "'k'", "not a serialized Datum")


def test_mean_file_missing_or_wrong_shape(tmp_path, imgs):
    write_lmdb(str(tmp_path / "db"), imageset_records([raw_datum(im, 0) for im in imgs]))
    fails(data_layer("db", 2, mean_file="nope.binaryproto"), str(tmp_path), "nope.binaryproto",
          "does not exist")
    write_mean(str(tmp_path / "m.binaryproto"), np.zeros((3, 20, 25), np.float32))
    fails(data_layer("db", 2, mean_file="m.binaryproto", crop_size=16), str(tmp_path),
          "m.binaryproto", "3x20x25", "3x20x24")
    (tmp_path / "bad.binaryproto").write_bytes(b"\x0a\xff\xff\xff\xff\x0f")
    fails(data_layer("db", 2, mean_file="bad.binaryproto"), str(tmp_path), "bad.binaryproto",
          "BlobProto")


def test_list_file_naming_a_missing_image(tmp_path, imgs):
    import cv2
    cv2.imwrite(str(tmp_path / "a.png"), imgs[0])
    (tmp_path / "list.txt").write_text(f"{tmp_path}/a.png 0\n\n{tmp_path}/gone.png 1\n")
    layer = pb.LayerParameter(name="img", type="ImageData", top=["data", "label"])
    layer.image_data_param.source, layer.image_data_param.batch_size = "list.txt", 1
    fails(layer, str(tmp_path), "list.txt:3", "gone.png", "does not exist", "layer 'img'")


def test_hdf5_without_the_tops_dataset(tmp_path):
    write_h5(str(tmp_path / "a.h5"), data=np.zeros((4, 2), np.float32))
    (tmp_path / "l.txt").write_text("a.h5\n")
    layer = pb.LayerParameter(name="h", type="HDF5Data", top=["data", "label"])
    layer.hdf5_data_param.source, layer.hdf5_data_param.batch_size = "l.txt", 2
    fails(layer, str(tmp_path), "a.h5", "no dataset 'label'", "layer 'h'")


def test_backend_mismatch_and_missing_extra(tmp_path, imgs, monkeypatch):
    write_lmdb(str(tmp_path / "db"), imageset_records([raw_datum(im, 0) for im in imgs]))
    fails(data_layer("db", 2, backend="LEVELDB"), str(tmp_path), "backend: LMDB")
    (tmp_path / "ldb").mkdir()
    monkeypatch.setitem(sys.modules, "plyvel", None)
    fails(data_layer("ldb", 2, backend="LEVELDB"), str(tmp_path), "amct_torch[leveldb]")


def test_a_refused_leveldb_is_closed_again(tmp_path, imgs):
    """LevelDB locks its folder while open: a source refused after opening it must close it,
    so that the corrected net opens the same database in the same process."""
    from helpers.caffe_dbs import write_leveldb
    write_leveldb(str(tmp_path / "ldb"), imageset_records([raw_datum(im, 0) for im in imgs]))
    fails(data_layer("ldb", 2, backend="LEVELDB", crop_size=64), str(tmp_path), "smaller than the crop")
    with open_data_layer(data_layer("ldb", 2, backend="LEVELDB"), base_dir=str(tmp_path)) as src:
        assert next(src.batches())["data"].shape == (2, 3, 20, 24)


def test_refused_data_layers_of_a_net_are_closed_again(tmp_path, imgs):
    """A net whose TEST data layers are refused together (their batch sizes differ) leaves no
    LevelDB of theirs locked, even while the error is kept (as an interactive session keeps
    the last traceback)."""
    from amct_torch.errors import ModelError
    from amct_torch.inputs.caffe_data import PhaseData
    from helpers.caffe_dbs import write_leveldb
    write_leveldb(str(tmp_path / "ldb"), imageset_records([raw_datum(im, 0) for im in imgs]))
    other = data_layer("ldb2", 3, tops=("extra",))
    write_lmdb(str(tmp_path / "ldb2"), imageset_records([raw_datum(im, 0) for im in imgs]))
    model = str(tmp_path / "net.prototxt")
    with pytest.raises(ModelError, match="different batch sizes") as kept:
        PhaseData([data_layer("ldb", 2, backend="LEVELDB"), other], model)
    assert kept.tb is not None  # the failed call's frames stay alive
    with open_data_layer(data_layer("ldb", 2, backend="LEVELDB"), base_dir=str(tmp_path)) as src:
        assert next(src.batches())["data"].shape == (2, 3, 20, 24)
