"""Data-layer fields that change the numbers are honoured or refused, never dropped."""
from __future__ import annotations

import cv2
import numpy as np
import pytest

from amct_torch.errors import DataError
from amct_torch.inputs.caffe_data import open_data_layer
from helpers.caffe_dbs import data_layer, encoded_datum, sized_images, write_lmdb


@pytest.fixture
def grey_lmdb(tmp_path):
    """An LMDB of two grey JPEGs (one channel as stored)."""
    imgs = [np.ascontiguousarray(im[:, :, :1]) for im in sized_images(2, (20, 24))]
    write_lmdb(str(tmp_path / "db"), [(f"{i}".encode(), encoded_datum(im, i).SerializeToString())
                                      for i, im in enumerate(imgs)])
    return str(tmp_path)


def test_old_force_encoded_color_decodes_in_colour(grey_lmdb):
    layer = data_layer("db", 2)
    layer.data_param.force_encoded_color = True
    with open_data_layer(layer, base_dir=grey_lmdb) as src:
        assert src.top_shapes()[0] == (2, 3, 20, 24)
        batch = next(src.batches())
    grey = np.ascontiguousarray(sized_images(2, (20, 24))[1][:, :, :1])
    jpeg = np.frombuffer(encoded_datum(grey, 1).data, np.uint8)
    want = cv2.imdecode(jpeg, cv2.IMREAD_COLOR).transpose(2, 0, 1).astype(np.float32)
    assert np.array_equal(batch["data"][1], want)


def test_one_of_crop_h_and_crop_w_is_refused(grey_lmdb):
    with pytest.raises(DataError, match="crop_h and crop_w"):
        open_data_layer(data_layer("db", 2, crop_h=16), base_dir=grey_lmdb)
