"""Caffe data written by code the way Caffe's tools write it: ``convert_imageset`` (LMDB or
LevelDB, keys ``%08d_<path>``, serialized Datum, raw C×H×W BGR pixels or ``--encoded`` image
files), ``convert_cifar_data``-style raw 3×32×32 records, ``compute_image_mean``'s binary
BlobProto, the SSD fork's AnnotatedDatum records, ImageData list files and HDF5Data files."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Optional

import numpy as np

from amct_torch.proto import amct_caffe_pb2 as pb


def natural_images() -> list[np.ndarray]:
    """Natural BGR uint8 images (H×W×3) of several sizes from skimage and sklearn."""
    import skimage.data
    from sklearn.datasets import load_sample_images
    rgb = [skimage.data.astronaut(), skimage.data.chelsea(), skimage.data.coffee()]
    rgb += list(load_sample_images().images)
    return [np.ascontiguousarray(im[..., ::-1]) for im in rgb]


def sized_images(count: int, size: tuple[int, int]) -> list[np.ndarray]:
    """``count`` natural BGR images resized (cv2, bilinear) to ``size`` (H, W), each a
    different crop, so that they differ."""
    import cv2
    base = natural_images()
    out = []
    for i in range(count):
        im = base[i % len(base)]
        h, w = im.shape[:2]
        k = i // len(base)
        y0, x0 = (7 * k) % (h // 4), (11 * k) % (w // 4)
        out.append(cv2.resize(im[y0:, x0:], (size[1], size[0])))
    return out


def raw_datum(img_hwc: np.ndarray, label: int) -> pb.Datum:
    """A Datum of raw pixels as CVMatToDatum stores them: C×H×W uint8."""
    img = img_hwc if img_hwc.ndim == 3 else img_hwc[:, :, None]
    d = pb.Datum(channels=img.shape[2], height=img.shape[0], width=img.shape[1], label=label)
    d.data = np.ascontiguousarray(img.transpose(2, 0, 1)).tobytes()
    return d


def encoded_datum(img_hwc: np.ndarray, label: int, ext: str = ".jpg") -> pb.Datum:
    """A Datum of an encoded image file (``--encoded``): only data, label and encoded set."""
    import cv2
    ok, buf = cv2.imencode(ext, img_hwc)
    assert ok
    return pb.Datum(data=buf.tobytes(), label=label, encoded=True)


def write_lmdb(path: str, records: Iterable[tuple[bytes, bytes]]) -> None:
    """An LMDB folder of (key, value) records, as Caffe's db_lmdb writes it."""
    import lmdb
    env = lmdb.open(path, map_size=1 << 30, subdir=True)
    with env.begin(write=True) as txn:
        for k, v in records:
            txn.put(k, v)
    env.close()


def write_leveldb(path: str, records: Iterable[tuple[bytes, bytes]]) -> None:
    """A LevelDB folder of (key, value) records, as Caffe's db_leveldb writes it."""
    import plyvel
    db = plyvel.DB(path, create_if_missing=True, error_if_exists=True)
    with db.write_batch() as wb:
        for k, v in records:
            wb.put(k, v)
    db.close()


def imageset_records(datums: list[pb.Datum], names: Optional[list[str]] = None
                     ) -> list[tuple[bytes, bytes]]:
    """convert_imageset's keys ``%08d_<path>`` with the serialized datums."""
    names = names or [f"img{i}.jpg" for i in range(len(datums))]
    return [(f"{i:08d}_{n}".encode(), d.SerializeToString())
            for i, (n, d) in enumerate(zip(names, datums))]


def write_mean(path: str, mean_chw: np.ndarray, legacy: bool = True) -> None:
    """A binaryproto mean as compute_image_mean writes it (legacy 1×C×H×W fields), or with a
    BlobShape."""
    c, h, w = mean_chw.shape
    blob = pb.BlobProto()
    if legacy:
        blob.num, blob.channels, blob.height, blob.width = 1, c, h, w
    else:
        blob.shape.dim.extend([1, c, h, w])
    blob.data.extend(mean_chw.astype(np.float32).ravel().tolist())
    with open(path, "wb") as f:
        f.write(blob.SerializeToString())


def data_layer(source: str, batch_size: int, *, backend: str = "LMDB", tops=("data", "label"),
               kind: str = "Data", **transform) -> pb.LayerParameter:
    """A Data (or AnnotatedData) layer reading ``source`` with the given transform_param."""
    layer = pb.LayerParameter(name="data", type=kind, top=list(tops))
    layer.data_param.source = source
    layer.data_param.batch_size = batch_size
    layer.data_param.backend = getattr(pb.DataParameter, backend)
    for k, v in transform.items():
        if isinstance(v, (list, tuple)):
            getattr(layer.transform_param, k).extend(v)
        else:
            setattr(layer.transform_param, k, v)
    return layer


def write_h5(path: str, **datasets: np.ndarray) -> None:
    import h5py
    with h5py.File(path, "w") as f:
        for name, arr in datasets.items():
            f.create_dataset(name, data=arr)
