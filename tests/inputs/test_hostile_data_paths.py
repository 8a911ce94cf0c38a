"""Input paths that used to hang or crash: a FIFO as the data file, inside a data folder or as
``--checkpoint`` is refused before it is opened (a child process with a timeout proves no
hang); a checkpoint in a folder that does not exist is refused before calibration; a
big-endian float64 or unsigned ``.npy`` is read as the same numbers; a ``.npz`` of many members
is bounded; a truncated PNG gives one stderr line."""
from __future__ import annotations

import io
import os
import subprocess
import sys
import time
import zipfile

import numpy as np
import pytest
import torch

from amct_torch.errors import DataError
from amct_torch.inputs.data import calibration_batches, count_samples
from amct_torch.inputs.limits import MAX_NPZ_MEMBERS
from amct_torch.workflow.examples import EXAMPLE_DIR, example_model

DATA = os.path.join(EXAMPLE_DIR, "digits_calib.npz")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPEC = [("data", [1, 1, 16, 16])]


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    return subprocess.run([sys.executable, "-m", "amct_torch.cli", *args], capture_output=True,
                          text=True, env=env, timeout=timeout)


def _calibrate(data: str, prefix: str, *extra: str) -> list[str]:
    model, weights = example_model()
    return ["calibrate", model, weights, data, "--device", "cpu", "-q", "--batch-num", "1",
            "--report-batches", "0", "-o", prefix, *extra]


def _one_clean_error(res: subprocess.CompletedProcess, names: str) -> str:
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2, res.stderr[-2000:]
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert names in lines[0], lines[0]
    return lines[0]


def _samples() -> np.ndarray:
    with np.load(DATA) as z:
        return np.ascontiguousarray(z["inputs"][:24])


@pytest.mark.parametrize("where", ["data_file", "in_folder", "checkpoint"])
def test_a_fifo_is_refused_without_blocking(tmp_path, where):
    fifo = str(tmp_path / ("x.npy" if where != "in_folder" else "folder/b.npy"))
    os.makedirs(os.path.dirname(fifo), exist_ok=True)
    os.mkfifo(fifo)
    if where == "data_file":
        args = _calibrate(fifo, str(tmp_path / "out" / "m"))
    elif where == "in_folder":
        np.save(tmp_path / "folder" / "a.npy", _samples())
        args = _calibrate(str(tmp_path / "folder"), str(tmp_path / "out" / "m"))
    else:
        args = _calibrate(DATA, str(tmp_path / "out" / "m"), "--checkpoint", fifo)
    line = _one_clean_error(_cli(*args, timeout=120), fifo)  # a hang fails with TimeoutExpired
    assert "FIFO" in line
    assert not os.path.exists(tmp_path / "out")


def test_a_character_device_as_data_is_refused(tmp_path):
    with pytest.raises(DataError, match="character device") as err:
        list(calibration_batches("/dev/zero", SPEC, 4))
    assert err.value.file == "/dev/zero"


def test_checkpoint_in_a_missing_folder_is_refused_before_calibration(tmp_path):
    ckpt = str(tmp_path / "no_such_folder" / "run.ckpt")
    t = time.time()
    res = _cli(*_calibrate(DATA, str(tmp_path / "out" / "m"), "--checkpoint", ckpt))
    line = _one_clean_error(res, ckpt)
    assert "does not exist" in line
    assert not os.path.exists(tmp_path / "out") and not os.path.exists(tmp_path / "no_such_folder")
    assert time.time() - t < 120


@pytest.mark.parametrize("dtype", [">f8", ">f4", "<f8", ">i2", "<u2", "u1", ">u4"])
def test_any_numeric_dtype_and_byte_order_reads_as_the_same_numbers(tmp_path, dtype):
    # values every one of these dtypes holds exactly
    x = np.random.default_rng(0).integers(0, 200, size=(6, 1, 16, 16)).astype(np.float32)
    p = str(tmp_path / "x.npy")
    np.save(p, x.astype(dtype))
    batches = list(calibration_batches(p, SPEC, 4))
    got = torch.cat(batches).numpy()
    assert got.dtype == np.float32 and np.array_equal(got, x)


def test_big_endian_float64_npy_gives_the_record_of_the_native_file(tmp_path):
    x = _samples()
    native, big = str(tmp_path / "native.npy"), str(tmp_path / "big.npy")
    np.save(native, x)
    np.save(big, x.astype(">f8"))
    recs = []
    for data, name in ((native, "a"), (big, "b")):
        res = _cli(*_calibrate(data, str(tmp_path / name / "m")))
        assert res.returncode == 0, res.stderr[-2000:]
        recs.append(open(tmp_path / name / "m_record.txt").read())
    assert recs[0] == recs[1]


@pytest.mark.parametrize("dtype", ["complex64", "object", "U3", "V8"])
def test_non_numeric_dtypes_are_a_data_error(tmp_path, dtype):
    p = str(tmp_path / "x.npy")
    arr = np.zeros((2, 1, 16, 16), dtype=dtype) if dtype != "object" else np.array([None, 1], dtype=object)
    np.save(p, arr, allow_pickle=dtype == "object")
    with pytest.raises(DataError) as err:
        list(calibration_batches(p, SPEC, 4))
    assert err.value.file == p


def _npz_of_members(path: str, n: int) -> str:
    buf = io.BytesIO()
    np.save(buf, np.zeros((1, 16, 16), np.float32))
    member = buf.getvalue()
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for i in range(n):
            z.writestr(f"s{i:06d}.npy", member)
    return path


def test_npz_with_more_members_than_the_limit_is_refused_quickly(tmp_path):
    p = _npz_of_members(str(tmp_path / "many.npz"), MAX_NPZ_MEMBERS + 1)
    t = time.time()
    with pytest.raises(DataError, match=f"at most {MAX_NPZ_MEMBERS}") as err:
        count_samples(p, SPEC)
    assert err.value.file == p
    assert time.time() - t < 10


def test_npz_members_are_read_in_linear_time(tmp_path):
    # each member used to reopen the archive (parsing its whole directory): quadratic
    small = _npz_of_members(str(tmp_path / "small.npz"), 500)
    big = _npz_of_members(str(tmp_path / "big.npz"), 4000)
    times = []
    for p, n in ((small, 500), (big, 4000)):
        t = time.perf_counter()
        assert count_samples(p, SPEC) == n
        total = sum(b.shape[0] for b in calibration_batches(p, SPEC, 64))
        times.append(time.perf_counter() - t)
        assert total == n
    # 8x the members: linear is ~8x; the quadratic reader was ~64x (allow for noise)
    assert times[1] < 25 * times[0] + 2.0, times


def test_truncated_png_gives_one_line_naming_it(tmp_path):
    import cv2
    img = (np.random.default_rng(0).random((64, 64)) * 255).astype(np.uint8)
    ok, png = cv2.imencode(".png", img)
    raw = png.tobytes()
    folder = tmp_path / "images"
    folder.mkdir()
    p = str(folder / "a.png")
    with open(p, "wb") as f:
        f.write(raw[:raw.index(b"IEND") - 4])  # every chunk whole, the end missing
    line = _one_clean_error(_cli(*_calibrate(str(folder), str(tmp_path / "out" / "m"))), p)
    assert "libpng" not in line


@pytest.mark.parametrize("which", ["quant_cfg", "evaluate_model", "reference_weights", "config_model"])
def test_a_fifo_as_a_model_or_config_file_is_refused_without_blocking(tmp_path, which):
    model, weights = example_model()
    fifo = str(tmp_path / f"{which}.fifo")
    os.mkfifo(fifo)
    argv = {"quant_cfg": ["config", model, weights, "--quant-cfg", fifo, "-o", str(tmp_path / "c.json")],
            "evaluate_model": ["evaluate", fifo, weights, DATA],
            "reference_weights": ["evaluate", model, weights, DATA, "--reference", model, fifo],
            "config_model": ["config", fifo, weights, "-o", str(tmp_path / "c.json")]}[which]
    line = _one_clean_error(_cli(*argv, "-q", timeout=120), fifo)
    assert "FIFO" in line and not os.path.exists(tmp_path / "c.json")


def test_damaged_jpegs_that_still_decode_give_one_warning_naming_a_file(tmp_path):
    import cv2
    img = (np.random.default_rng(0).random((32, 32, 3)) * 255).astype(np.uint8)
    raw = cv2.imencode(".jpg", img)[1].tobytes()
    folder = tmp_path / "images"
    folder.mkdir()
    for name in ("a.jpg", "b.jpg", "c.jpg"):
        (folder / name).write_bytes(raw[:len(raw) * 2 // 3])  # libjpeg: premature end
    args = [a for a in _calibrate(str(folder), str(tmp_path / "out" / "m")) if a != "-q"]
    res = _cli(*args)
    assert res.returncode == 0, res.stderr[-2000:]
    # (other warnings, such as a missing C compiler's, may come too)
    lines = [line for line in res.stderr.splitlines() if "JPEG" in line or "decoder" in line]
    assert len(lines) == 1 and lines[0].startswith("WARNING") and str(folder / "a.jpg") in lines[0], lines
