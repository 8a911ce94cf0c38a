"""The two image front ends (an image folder with ``Preprocess``; a Caffe ``ImageData`` layer
with ``transform_param``) give the same bits for a case both can express, and both equal a
reference computed plainly here with numpy (and cv2.resize for the resize)."""
from __future__ import annotations

import cv2
import numpy as np
import pytest

from amct_torch.inputs.caffe_data import open_data_layer
from amct_torch.inputs.data import Preprocess, calibration_batches
from amct_torch.proto import amct_caffe_pb2 as pb
from helpers.caffe_dbs import natural_images

MEAN = [104.0, 116.5, 123.25]
SCALE = 0.017
CROP = 96


def reference(img: np.ndarray, resize) -> np.ndarray:
    """Resize (bilinear), centre crop at ((H - 96) // 2, (W - 96) // 2), then
    (pixel - mean) * scale in float32, as C×H×W."""
    if resize is not None:
        img = cv2.resize(img, (resize[1], resize[0]), interpolation=cv2.INTER_LINEAR)
    h, w = img.shape[:2]
    y, x = (h - CROP) // 2, (w - CROP) // 2
    window = img[y:y + CROP, x:x + CROP].astype(np.float32)
    out = (window - np.array(MEAN, np.float32)) * np.float32(SCALE)
    return out.transpose(2, 0, 1)


@pytest.mark.parametrize("resize", [None, (131, 157)], ids=["crop", "resize_then_crop"])
def test_preprocess_and_caffe_transform_param_agree(tmp_path, resize):
    img = natural_images()[1][:201, :173]  # an odd size: the centre offsets round down
    (tmp_path / "imgs").mkdir()
    path = tmp_path / "imgs" / "a.png"
    assert cv2.imwrite(str(path), img)
    ref = reference(img, resize)

    pre = Preprocess(mean=MEAN, scale=SCALE, crop=CROP, resize=resize)
    (folder_batch,) = list(calibration_batches(str(tmp_path / "imgs"), [("data", [1, 3, CROP, CROP])],
                                               preprocess=pre))

    layer = pb.LayerParameter(name="img", type="ImageData", top=["data", "label"])
    layer.image_data_param.source = "list.txt"
    layer.image_data_param.batch_size = 1
    if resize is not None:
        layer.image_data_param.new_height, layer.image_data_param.new_width = resize
    layer.transform_param.crop_size = CROP
    layer.transform_param.mean_value.extend(MEAN)
    layer.transform_param.scale = SCALE
    (tmp_path / "list.txt").write_text(f"{path} 0\n")
    with open_data_layer(layer, base_dir=str(tmp_path)) as src:
        caffe_batch = next(src.batches())["data"]

    assert folder_batch.shape == (1, 3, CROP, CROP) and caffe_batch.shape == (1, 3, CROP, CROP)
    assert np.array_equal(folder_batch[0].numpy(), ref)
    assert np.array_equal(caffe_batch[0], ref)
