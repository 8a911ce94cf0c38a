"""ImageData, HDF5Data, AnnotatedData, DummyData and MemoryData layers against references
computed plainly here from the same files (cv2.imread / cv2.resize, h5py-free numpy arrays,
the boxes as written)."""
from __future__ import annotations

import cv2
import numpy as np
import pytest

from amct_torch.errors import DataError
from amct_torch.inputs.caffe_data import open_data_layer
from amct_torch.proto import amct_caffe_pb2 as pb
from helpers.caffe_dbs import (
    data_layer,
    encoded_datum,
    natural_images,
    sized_images,
    write_h5,
    write_lmdb,
)


def image_data_layer(source: str, batch: int, **p) -> pb.LayerParameter:
    layer = pb.LayerParameter(name="img", type="ImageData", top=["data", "label"])
    layer.image_data_param.source = source
    layer.image_data_param.batch_size = batch
    for k, v in p.items():
        if k in ("crop_size", "scale"):
            setattr(layer.transform_param, k, v)
        elif k == "mean_value":
            layer.transform_param.mean_value.extend(v)
        else:
            setattr(layer.image_data_param, k, v)
    return layer


def test_image_list_with_spaces_root_folder_and_resize(tmp_path):
    imgs = natural_images()[:4]
    (tmp_path / "pics").mkdir()
    names = ["a b.png", "c.png", "dir name x.jpg", "e.png"]
    for name, im in zip(names, imgs):
        cv2.imwrite(str(tmp_path / "pics" / name), im)
    (tmp_path / "list.txt").write_text(
        "".join(f"{n} {i + 5}\n" for i, n in enumerate(names)) + "\n")
    layer = image_data_layer("list.txt", 3, root_folder=str(tmp_path / "pics") + "/",
                             new_height=70, new_width=90, crop_size=64, mean_value=[10, 20, 30],
                             scale=0.5)
    with open_data_layer(layer, base_dir=str(tmp_path)) as src:
        assert src.num_samples == 4 and src.top_shapes() == [(3, 3, 64, 64), (3,)]
        it = src.batches()
        b1, b2 = next(it), next(it)
    for k, i in enumerate([0, 1, 2, 3, 0, 1]):
        im = cv2.resize(cv2.imread(str(tmp_path / "pics" / names[i]), cv2.IMREAD_COLOR), (90, 70))
        ref = (im[3:67, 13:77].transpose(2, 0, 1).astype(np.float32)
               - np.array([10, 20, 30], np.float32)[:, None, None]) * np.float32(0.5)
        got = (b1 if k < 3 else b2)["data"][k % 3]
        assert np.array_equal(got, ref), k
    assert b1["label"].tolist() + b2["label"].tolist() == [5, 6, 7, 8, 5, 6]


def test_image_list_grey(tmp_path):
    im = natural_images()[1]
    cv2.imwrite(str(tmp_path / "x.png"), im)
    (tmp_path / "l.txt").write_text(f"{tmp_path / 'x.png'} 1\n")
    with open_data_layer(image_data_layer(str(tmp_path / "l.txt"), 1, is_color=False),
                         base_dir="/nonexistent") as src:
        got = next(src.batches())["data"]
    ref = cv2.imread(str(tmp_path / "x.png"), cv2.IMREAD_GRAYSCALE).astype(np.float32)
    assert got.shape == (1, 1, *ref.shape) and np.array_equal(got[0, 0], ref)
    # a relative list and image name, not found from the working directory: beside the prototxt
    (tmp_path / "rel.txt").write_text("x.png 2\n")
    with open_data_layer(image_data_layer("rel.txt", 1, is_color=False),
                         base_dir=str(tmp_path)) as src:
        batch = next(src.batches())
    assert np.array_equal(batch["data"][0, 0], ref) and batch["label"].tolist() == [2.0]


def test_hdf5_files_in_order_across_files(tmp_path):
    from sklearn.datasets import load_digits
    dg = load_digits()
    x = dg.images[:7, None].astype(np.float64)
    y = dg.target[:7].astype(np.int64)
    write_h5(str(tmp_path / "a.h5"), data=x[:4], label=y[:4])
    write_h5(str(tmp_path / "b.h5"), data=x[4:], label=y[4:])
    (tmp_path / "files.txt").write_text("a.h5\n  b.h5\n")
    layer = pb.LayerParameter(name="h5", type="HDF5Data", top=["data", "label"])
    layer.hdf5_data_param.source = "files.txt"
    layer.hdf5_data_param.batch_size = 3
    with open_data_layer(layer, base_dir=str(tmp_path)) as src:
        assert src.num_samples == 7 and src.top_shapes() == [(3, 1, 8, 8), (3,)]
        it = src.batches(start=1)
        got = [next(it) for _ in range(3)]  # items 3..11: crosses a.h5 -> b.h5 -> wraps
    order = [i % 7 for i in range(3, 12)]
    assert np.array_equal(np.concatenate([g["data"] for g in got]), x[order].astype(np.float32))
    assert np.concatenate([g["label"] for g in got]).tolist() == y[order].tolist()


def test_annotated_data_image_and_boxes(tmp_path):
    imgs = sized_images(3, (50, 60))
    recs = []
    for i, im in enumerate(imgs):
        a = pb.AnnotatedDatum(type=pb.AnnotatedDatum.BBOX)
        a.datum.CopyFrom(encoded_datum(im, 0))
        a.datum.height, a.datum.width = 50, 60
        g = a.annotation_group.add(group_label=i + 1)
        b = g.annotation.add(instance_id=0).bbox
        b.xmin, b.ymin, b.xmax, b.ymax, b.difficult = 0.1, 0.2, 0.5, 0.9, i == 2
        recs.append((f"{i:08d}_x.jpg".encode(), a.SerializeToString()))
    write_lmdb(str(tmp_path / "voc"), recs)
    layer = data_layer("voc", 3, kind="AnnotatedData", mean_value=[104, 117, 123])
    rp = layer.transform_param.resize_param
    rp.resize_mode, rp.height, rp.width = pb.ResizeParameter.WARP, 30, 40
    rp.interp_mode.append(pb.ResizeParameter.LINEAR)
    with open_data_layer(layer, base_dir=str(tmp_path)) as src:
        assert src.top_shapes()[0] == (3, 3, 30, 40)
        batch = next(src.batches())
    for i in range(3):
        dec = cv2.imdecode(np.frombuffer(encoded_datum(imgs[i], 0).data, np.uint8), -1)
        ref = cv2.resize(dec, (40, 30), interpolation=cv2.INTER_LINEAR).transpose(2, 0, 1)
        ref = ref.astype(np.float32) - np.array([104, 117, 123], np.float32)[:, None, None]
        assert np.array_equal(batch["data"][i], ref)
    rows = batch["label"].reshape(-1, 8)
    assert batch["label"].shape == (1, 1, 3, 8)
    want = [[i, i + 1, 0, 0.1, 0.2, 0.5, 0.9, float(i == 2)] for i in range(3)]
    assert np.allclose(rows, np.array(want, np.float32))


def test_dummy_data_and_memory_data():
    layer = pb.LayerParameter(name="d", type="DummyData", top=["data", "label"])
    p = layer.dummy_data_param
    p.shape.add().dim.extend([2, 3, 4, 5])
    p.shape.add().dim.extend([2])
    p.data_filler.add(type="constant", value=1.5)
    p.data_filler.add(type="constant", value=0)
    with open_data_layer(layer, base_dir=".") as src:
        assert src.top_shapes() == [(2, 3, 4, 5), (2,)] and src.batch_size == 2
        b = next(src.batches())
    assert (b["data"] == 1.5).all() and (b["label"] == 0).all()
    mem = pb.LayerParameter(name="m", type="MemoryData", top=["data", "label"])
    mem.memory_data_param.batch_size, mem.memory_data_param.channels = 4, 3
    mem.memory_data_param.height = mem.memory_data_param.width = 8
    with open_data_layer(mem, base_dir=".") as src:
        assert src.top_shapes() == [(4, 3, 8, 8), (4,)]
        with pytest.raises(DataError, match="layer 'm'.*user's program"):
            next(src.batches())


def test_annotated_boxes_follow_the_centre_crop(tmp_path):
    """A 50x60 image cropped to 40x40 at (5, 10): the crop is x in [1/6, 5/6], y in
    [0.1, 0.9]; boxes are re-normalized to it and clipped, boxes outside it dropped."""
    im = sized_images(1, (50, 60))[0]
    a = pb.AnnotatedDatum(type=pb.AnnotatedDatum.BBOX)
    a.datum.CopyFrom(encoded_datum(im, 0, ".png"))
    a.datum.height, a.datum.width = 50, 60
    g = a.annotation_group.add(group_label=3)
    for i, (x0, y0, x1, y1) in enumerate([(0.0, 0.0, 0.5, 0.5), (0.9, 0.0, 1.0, 0.05),
                                          (0.25, 0.3, 0.75, 0.7)]):
        b = g.annotation.add(instance_id=i).bbox
        b.xmin, b.ymin, b.xmax, b.ymax = x0, y0, x1, y1
    write_lmdb(str(tmp_path / "db"), [(b"00000000_a.png", a.SerializeToString())])
    layer = data_layer("db", 1, kind="AnnotatedData", crop_size=40)
    with open_data_layer(layer, base_dir=str(tmp_path)) as src:
        batch = next(src.batches())
    assert np.array_equal(batch["data"][0], im[5:45, 10:50].transpose(2, 0, 1).astype(np.float32))
    rows = batch["label"].reshape(-1, 8)
    want = [[0, 3, 0, 0.0, 0.0, (0.5 - 1 / 6) * 1.5, 0.5, 0],
            [0, 3, 2, (0.25 - 1 / 6) * 1.5, 0.25, (0.75 - 1 / 6) * 1.5, 0.75, 0]]
    assert np.allclose(rows, want, atol=1e-6)
