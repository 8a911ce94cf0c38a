"""Calibration data loading: images preprocessed the Caffe way (checked against hand-worked
pixel arithmetic), arrays and .npy/.npz files batched, and every bad input a DataError naming
the file."""
from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch

from amct_torch import DataError
from amct_torch.inputs.data import Preprocess, calibration_batches

RGB_INPUT = [("data", [1, 3, 2, 2])]


def write_png(path, bgr: np.ndarray) -> str:
    assert cv2.imwrite(str(path), bgr)
    return str(path)


def test_image_crop_channel_order_mean_scale_by_hand(tmp_path):
    # a 4x4 BGR image whose pixel (y, x) channel c is 10*y + x + 100*c
    img = np.zeros((4, 4, 3), np.uint8)
    for y in range(4):
        for x in range(4):
            img[y, x] = [10 * y + x, 10 * y + x + 100, 10 * y + x + 200 - 50]
    folder = tmp_path / "imgs"
    folder.mkdir()
    write_png(folder / "a.png", img)
    pre = Preprocess(channel_order="rgb", mean=[1, 2, 3], scale=0.5, crop=2)
    (batch,) = list(calibration_batches(str(folder), RGB_INPUT, preprocess=pre))
    assert batch.shape == (1, 3, 2, 2)
    # centre crop of 4x4 by 2x2 = rows 1..2, cols 1..2; RGB = reversed BGR
    for c_out, c_in in enumerate((2, 1, 0)):
        for yy in range(2):
            for xx in range(2):
                raw = float(img[1 + yy, 1 + xx, c_in])
                assert batch[0, c_out, yy, xx].item() == pytest.approx((raw - [1, 2, 3][c_out]) * 0.5)


def test_images_resized_to_the_declared_input_by_default(tmp_path):
    folder = tmp_path / "imgs"
    folder.mkdir()
    for i in range(3):
        write_png(folder / f"{i}.jpg", np.full((7, 5, 3), 40 * i, np.uint8))
    batches = list(calibration_batches(str(folder), [("data", [1, 3, 6, 8])], batch_size=2))
    assert [tuple(b.shape) for b in batches] == [(2, 3, 6, 8), (1, 3, 6, 8)]
    assert torch.all(batches[1] == 80)  # a constant image stays constant through resizing


def test_grayscale_net_reads_images_as_one_channel(tmp_path):
    folder = tmp_path / "imgs"
    folder.mkdir()
    write_png(folder / "g.png", np.full((2, 2, 3), [0, 255, 0], np.uint8))
    (b,) = list(calibration_batches(str(folder), [("data", [1, 1, 2, 2])]))
    # OpenCV's BGR->gray weights: 0.299 R + 0.587 G + 0.114 B
    assert b.shape == (1, 1, 2, 2) and b[0, 0, 0, 0].item() == pytest.approx(0.587 * 255, abs=1)


def test_non_image_file_in_folder_is_named(tmp_path):
    folder = tmp_path / "imgs"
    folder.mkdir()
    write_png(folder / "a.png", np.zeros((2, 2, 3), np.uint8))
    (folder / "notes.txt").write_text("hello")
    with pytest.raises(DataError) as err:
        list(calibration_batches(str(folder), RGB_INPUT))
    assert "notes.txt" in str(err.value)


def test_corrupt_image_is_named(tmp_path):
    folder = tmp_path / "imgs"
    folder.mkdir()
    (folder / "broken.png").write_bytes(b"not a png at all")
    with pytest.raises(DataError) as err:
        list(calibration_batches(str(folder), RGB_INPUT))
    assert "broken.png" in str(err.value)


def test_npz_and_npy_files_are_batched(tmp_path):
    x = np.arange(5 * 3 * 2 * 2, dtype=np.float32).reshape(5, 3, 2, 2)
    np.savez(tmp_path / "calib.npz", inputs=x, labels=np.arange(5))
    np.save(tmp_path / "calib.npy", x)
    for name in ("calib.npz", "calib.npy"):
        batches = list(calibration_batches(str(tmp_path / name), RGB_INPUT, batch_size=2))
        assert [b.shape[0] for b in batches] == [2, 2, 1]
        assert np.array_equal(torch.cat(batches).numpy(), x)


def test_wrong_channel_count_names_the_file_and_the_expected_shape(tmp_path):
    np.save(tmp_path / "bad.npy", np.zeros((2, 1, 2, 2), np.float32))
    with pytest.raises(DataError) as err:
        list(calibration_batches(str(tmp_path / "bad.npy"), RGB_INPUT))
    assert "bad.npy" in str(err.value) and "(N, 3, 2, 2)" in str(err.value)
    assert "[2, 1, 2, 2]" in str(err.value)


def test_iterable_of_batches_and_single_samples(tmp_path):
    items = [np.ones((2, 3, 2, 2), np.float32), torch.zeros(3, 2, 2)]
    out = list(calibration_batches(items, RGB_INPUT))
    assert [tuple(b.shape) for b in out] == [(2, 3, 2, 2), (1, 3, 2, 2)]
    # (inputs, labels) pairs as a DataLoader yields them
    pairs = [(torch.ones(4, 3, 2, 2), torch.arange(4))]
    assert tuple(next(iter(calibration_batches(pairs, RGB_INPUT))).shape) == (4, 3, 2, 2)


def test_missing_path_and_bad_settings(tmp_path):
    with pytest.raises(DataError) as err:
        list(calibration_batches(str(tmp_path / "nope"), RGB_INPUT))
    assert "nope" in str(err.value)
    with pytest.raises(DataError):
        list(calibration_batches([], RGB_INPUT, preprocess=Preprocess(channel_order="grb")))
    with pytest.raises(DataError, match="scale must be a finite non-zero number"):
        Preprocess(scale=0)  # every input would be 0
    with pytest.raises(DataError):
        list(calibration_batches(np.zeros((2, 3, 2, 2)), RGB_INPUT, batch_size=0))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError):
        list(calibration_batches(str(empty), RGB_INPUT))
