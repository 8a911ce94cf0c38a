"""Calibration data: turn what a user has into batches the model takes.

Why: AMCT users feed Caffe models images preprocessed the Caffe way (BGR, mean subtraction,
scale, resize + crop), or arrays they already prepared. This module accepts

* an iterable whose items are batches (tensor or array, N×C×H×W, or C×H×W for one sample;
  a tuple/list of those for nets with several inputs),
* one array/tensor holding all samples (split into ``batch_size`` batches),
* a path: a ``.npy``/``.npz`` file, or a folder of images or of ``.npy``/``.npz`` files,

and checks every batch against the net's declared inputs, raising ``DataError`` naming the
file (and what was expected) instead of failing deep inside a layer. Images are read with
OpenCV (BGR, like Caffe's ``cv2``-based tools) and preprocessed by ``Preprocess``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Optional, Sequence, Union

import numpy as np
import torch

from amct_torch.errors import DataError

IMAGE_EXTS = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp", ".ppm", ".pgm", ".pbm")
ARRAY_EXTS = (".npy", ".npz")

Batch = Union[torch.Tensor, tuple]


@dataclass(frozen=True)
class Preprocess:
    """Caffe-style image preprocessing, applied in this order:

    1. read as BGR (OpenCV), or grayscale when the net takes one channel;
    2. ``resize``: (H, W), or one int = the shorter side (aspect kept); None = the net's
       declared H×W when no ``crop`` is given;
    3. ``crop``: centre crop (H, W) or one int for a square;
    4. ``channel_order`` "bgr" (Caffe's default) or "rgb";
    5. ``(pixel - mean) * scale`` with ``mean`` one value or one per channel (in the final
       channel order), as Caffe's ``transform_param`` does.
    """

    channel_order: str = "bgr"
    mean: Optional[Sequence[float]] = None
    scale: float = 1.0
    resize: Optional[Union[int, Sequence[int]]] = None
    crop: Optional[Union[int, Sequence[int]]] = None

    def check(self) -> None:
        """Refuse nonsense settings with a DataError (the CLI's exit code 2)."""
        if self.channel_order not in ("bgr", "rgb"):
            raise DataError(f"channel order must be 'bgr' or 'rgb', got {self.channel_order!r}")
        for what, v in (("resize", self.resize), ("crop", self.crop)):
            if v is None:
                continue
            vals = [v] if isinstance(v, int) else list(v)
            if len(vals) not in (1, 2) or any(int(x) < 1 for x in vals):
                raise DataError(f"{what} must be one positive size or H,W; got {v!r}")
        if not np.isfinite(self.scale) or self.scale == 0:
            raise DataError(f"scale must be a finite non-zero number, got {self.scale!r}")


def _hw(v: Union[int, Sequence[int]]) -> tuple[int, int]:
    vals = [v] if isinstance(v, int) else [int(x) for x in v]
    return (vals[0], vals[0]) if len(vals) == 1 else (vals[0], vals[1])


def load_image(path: str, pre: Preprocess, channels: int,
               target_hw: Optional[tuple[int, int]]) -> np.ndarray:
    """One image file as a float32 C×H×W array, preprocessed by ``pre``."""
    import cv2

    flag = cv2.IMREAD_GRAYSCALE if channels == 1 else cv2.IMREAD_COLOR
    img = cv2.imread(path, flag)
    if img is None:
        raise DataError("cannot read this file as an image (not an image, or corrupt)", file=path)
    if img.ndim == 2:
        img = img[:, :, None]
    if channels not in (1, 3):
        raise DataError(f"the net takes {channels} input channels; images give 1 or 3", file=path)
    resize = pre.resize if pre.resize is not None else (None if pre.crop is not None else target_hw)
    if resize is not None:
        if isinstance(resize, int) or len(list(resize)) == 1:
            short = _hw(resize)[0]
            h, w = img.shape[:2]
            f = short / min(h, w)
            size = (max(1, round(w * f)), max(1, round(h * f)))
        else:
            rh, rw = _hw(resize)
            size = (rw, rh)
        img = cv2.resize(img, size, interpolation=cv2.INTER_LINEAR)
        if img.ndim == 2:
            img = img[:, :, None]
    if pre.crop is not None:
        ch, cw = _hw(pre.crop)
        h, w = img.shape[:2]
        if ch > h or cw > w:
            raise DataError(f"crop {ch}x{cw} is larger than the (resized) image {h}x{w}", file=path)
        y, x = (h - ch) // 2, (w - cw) // 2
        img = img[y:y + ch, x:x + cw]
    arr = img.astype(np.float32)
    if channels == 3 and pre.channel_order == "rgb":
        arr = arr[:, :, ::-1]
    if pre.mean is not None:
        mean = np.asarray(list(pre.mean), dtype=np.float32).reshape(-1)
        if mean.size not in (1, arr.shape[2]):
            raise DataError(f"mean has {mean.size} values, the images have {arr.shape[2]} channels")
        arr = arr - mean
    arr = arr * np.float32(pre.scale)
    return np.ascontiguousarray(arr.transpose(2, 0, 1))


def _load_arrays(path: str) -> list[np.ndarray]:
    """The arrays of a .npy file, or of a .npz file (every array it holds, in key order)."""
    try:
        if path.endswith(".npy"):
            return [np.load(path, allow_pickle=False)]
        with np.load(path, allow_pickle=False) as z:
            if not z.files:
                raise DataError("the .npz file holds no array", file=path)
            keys = ["inputs"] if "inputs" in z.files else (["data"] if "data" in z.files else z.files)
            return [z[k] for k in keys]
    except DataError:
        raise
    except (OSError, ValueError) as err:
        raise DataError(f"cannot read the array file: {err}", file=path) from None


class InputSpec:
    """What one net input takes: name and declared shape (N, C, H, W) or None."""

    def __init__(self, name: str, shape: Optional[Sequence[int]]) -> None:
        self.name = name
        self.shape = None if not shape else [int(d) for d in shape]

    @property
    def channels(self) -> Optional[int]:
        return self.shape[1] if self.shape and len(self.shape) >= 2 else None

    @property
    def hw(self) -> Optional[tuple[int, int]]:
        return (self.shape[2], self.shape[3]) if self.shape and len(self.shape) == 4 else None

    def check(self, arr: Union[np.ndarray, torch.Tensor], source: str) -> torch.Tensor:
        """``arr`` as a float32 batch tensor of this input; DataError naming ``source`` when its
        rank or channel count does not fit the declared shape. H×W is not enforced: Caffe
        reshapes to the data and fully convolutional nets take any size (a net that cannot
        fails with a ModelError naming the layer)."""
        t = arr if isinstance(arr, torch.Tensor) else torch.from_numpy(np.asarray(arr))
        if not (t.is_floating_point() or t.dtype in (torch.uint8, torch.int8, torch.int16, torch.int32,
                                                        torch.int64)):
            raise DataError(f"input '{self.name}' data has dtype {t.dtype}; expected numbers",
                            file=source)
        if self.shape is not None and t.dim() == len(self.shape) - 1:
            t = t.unsqueeze(0)
        if self.shape is not None:
            want = "(" + ", ".join(["N"] + [str(d) for d in self.shape[1:]]) + ")"
            bad = t.dim() != len(self.shape) or (len(self.shape) >= 2 and t.shape[1] != self.shape[1])
            if bad:
                raise DataError(f"input '{self.name}' expects batches shaped {want}, got "
                                f"{list(t.shape)}", file=source)
        if t.numel() == 0:
            raise DataError(f"input '{self.name}' got an empty batch", file=source)
        return t if t.dtype == torch.float32 else t.float()


def _files(folder: str) -> list[str]:
    names = sorted(n for n in os.listdir(folder) if not n.startswith("."))
    paths = [os.path.join(folder, n) for n in names if os.path.isfile(os.path.join(folder, n))]
    if not paths:
        raise DataError("the data folder has no files", file=folder)
    return paths


def _folder_samples(folder: str, pre: Preprocess, spec: InputSpec) -> Iterator[tuple[np.ndarray, str]]:
    """(C×H×W sample, its file) for every file of a folder; every file must be an image or an
    array file (one kind per folder), anything else is a DataError naming it."""
    paths = _files(folder)
    kinds = set()
    for p in paths:
        ext = os.path.splitext(p)[1].lower()
        if ext in IMAGE_EXTS:
            kinds.add("image")
        elif ext in ARRAY_EXTS:
            kinds.add("array")
        else:
            raise DataError("not an image or .npy/.npz file; the data folder must hold only "
                            f"images ({', '.join(IMAGE_EXTS)}) or .npy/.npz files", file=p)
    if len(kinds) > 1:
        raise DataError("the data folder mixes images and .npy/.npz files; use one kind", file=folder)
    channels = spec.channels or 3
    for p in paths:
        if "image" in kinds:
            yield load_image(p, pre, channels, spec.hw), p
        else:
            for arr in _load_arrays(p):
                arr = np.asarray(arr)
                if spec.shape is not None and arr.ndim == len(spec.shape):
                    for i in range(arr.shape[0]):
                        yield arr[i], p
                else:
                    yield arr, p


def _batched(samples: Iterable[tuple[Any, str]], batch_size: int, spec: InputSpec) -> Iterator[torch.Tensor]:
    buf: list[torch.Tensor] = []
    for arr, src in samples:
        t = spec.check(arr, src)
        for row in t:
            buf.append(row)
            if len(buf) == batch_size:
                yield _stack(buf, src)
                buf = []
    if buf:
        yield _stack(buf, "<data>")


def _stack(rows: list[torch.Tensor], src: str) -> torch.Tensor:
    shapes = {tuple(r.shape) for r in rows}
    if len(shapes) > 1:
        raise DataError(f"samples of one batch have different shapes {sorted(shapes)}; "
                        "use --resize/--crop to give them one size", file=src)
    return torch.stack(rows)


def calibration_batches(data: Any, inputs: Sequence[tuple[str, Optional[Sequence[int]]]],
                        batch_size: Optional[int] = None,
                        preprocess: Optional[Preprocess] = None) -> Iterator[Batch]:
    """Batches for a net with declared ``inputs`` [(name, shape)] from ``data`` (see the module
    docstring). A batch is a float32 tensor, or a tuple of tensors for nets with several inputs.

    ``batch_size`` applies to paths and to a single array/tensor holding all samples (default
    1 sample per batch there); an iterable's items are taken as the batches they are.
    """
    specs = [InputSpec(n, s) for n, s in inputs]
    if not specs:
        raise DataError("the net declares no input")
    pre = preprocess or Preprocess()
    pre.check()
    if batch_size is not None and (isinstance(batch_size, bool) or int(batch_size) < 1):
        raise DataError(f"batch size must be >= 1, got {batch_size!r}")
    bs = int(batch_size) if batch_size is not None else 1
    if isinstance(data, (str, os.PathLike)):
        path = os.fspath(data)
        if len(specs) != 1:
            raise DataError("data from a path is supported for single-input nets only; pass an "
                            "iterable of tuples for several inputs", file=path)
        if os.path.isdir(path):
            return _batched(_folder_samples(path, pre, specs[0]), bs, specs[0])
        if not os.path.exists(path):
            raise DataError("calibration data not found", file=path)
        ext = os.path.splitext(path)[1].lower()
        if ext in ARRAY_EXTS:
            arrays = _load_arrays(path)
            return _batched(((a, path) for a in arrays), bs, specs[0])
        if ext in IMAGE_EXTS:
            return _batched(iter([(load_image(path, pre, specs[0].channels or 3, specs[0].hw), path)]),
                            bs, specs[0])
        raise DataError("calibration data must be a folder, an image or a .npy/.npz file", file=path)
    if isinstance(data, (np.ndarray, torch.Tensor)):
        if len(specs) != 1:
            raise DataError("one array was given but the net has several inputs; pass tuples")
        return _batched(iter([(data, "<array>")]), bs, specs[0])
    try:
        iterator = iter(data)
    except TypeError:
        raise DataError(f"calibration data must be a path, an array or an iterable of batches, "
                        f"got {type(data).__name__}") from None
    return _iter_batches(iterator, specs)


def _iter_batches(iterator: Iterator[Any], specs: list[InputSpec]) -> Iterator[Batch]:
    for i, item in enumerate(iterator):
        src = f"<batch {i}>"
        if isinstance(item, (tuple, list)) and len(specs) > 1:
            if len(item) != len(specs):
                raise DataError(f"batch {i} has {len(item)} inputs, the net takes {len(specs)}")
            yield tuple(s.check(a, src) for s, a in zip(specs, item))
        elif isinstance(item, (tuple, list)) and len(item) >= 1 and \
                isinstance(item[0], (np.ndarray, torch.Tensor)) and len(specs) == 1 and \
                not isinstance(item, list):
            # (inputs, labels) pairs from a DataLoader: the first element is the input.
            yield specs[0].check(item[0], src)
        else:
            if len(specs) > 1:
                raise DataError(f"batch {i} is one array but the net takes {len(specs)} inputs")
            yield specs[0].check(item, src)
