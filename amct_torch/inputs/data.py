"""Calibration data: turn what a user has into batches the model takes.

Accepted: an iterable of batches (N×C×H×W or C×H×W, a tuple of those for several inputs), one
array holding all samples (split into ``batch_size`` batches), or a path (a ``.npy``/``.npz``
file, or a folder of images or of ``.npy``/``.npz`` files). Why the checks: every batch is held
against the net's declared inputs, and a mismatch is a ``DataError`` naming the file and what
was expected, not a failure deep inside a layer. Images are read with OpenCV (BGR, as Caffe's
tools) and preprocessed by ``Preprocess``. docs/data.md."""
from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Any, Optional, Union

import numpy as np
import torch

from amct_torch.errors import DataError
from amct_torch.inputs.image_checks import MAX_IMAGE_PIXELS, bound_opencv_decoding, check_png_chunks, image_size
from amct_torch.inputs.limits import MAX_NPZ_MEMBERS, check_regular_file, file_kind
from amct_torch.inputs.transform import centre_window, resize_hwc, subtract_and_scale

IMAGE_EXTS = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp", ".ppm", ".pgm", ".pbm")
ARRAY_EXTS = (".npy", ".npz")

Batch = Union[torch.Tensor, tuple]
log = logging.getLogger("amct_torch")
#: what the image decoders said about images they still decoded, warned once each
_DECODER_NOTES: set = set()


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

    def __post_init__(self) -> None:  # wrong types or values: a DataError naming the field
        from amct_torch.arguments import ArgumentError, check_values, numbers_arg, one_of, opt, sizes_arg
        fields = {"channel_order": self.channel_order, "mean": self.mean, "scale": self.scale,
                  "resize": self.resize, "crop": self.crop}
        try:
            check_values("Preprocess()", fields, {
                "channel_order": one_of("bgr", "rgb"), "mean": opt(numbers_arg), "scale": _scale_arg,
                "resize": opt(sizes_arg), "crop": opt(sizes_arg)})
        except ArgumentError as err:
            raise DataError(err.message) from None


def _scale_arg(value: Any, name: str) -> float:
    """A finite non-zero number (a zero scale makes every input 0)."""
    from amct_torch.arguments import ArgumentError, number_arg
    scale = number_arg(value, name)
    if scale == 0:
        raise ArgumentError(f"{name} must be a finite non-zero number, got {value!r}")
    return scale


def _hw(v: Union[int, Sequence[int]]) -> tuple[int, int]:
    vals = [v] if isinstance(v, int) else [int(x) for x in v]
    return (vals[0], vals[0]) if len(vals) == 1 else (vals[0], vals[1])


def check_resize(hw: Optional[tuple[int, int]], pre: Preprocess, file: Optional[str]) -> None:
    """Refuse, before any image is read, a resize target above ``MAX_IMAGE_PIXELS`` (e.g. a
    prototxt declaring a 100000x100000 input): ``DataError`` naming ``file`` (the model)."""
    target = pre.resize if pre.resize is not None else (None if pre.crop is not None else hw)
    if target is None:
        return
    h, w = _hw(target)
    if isinstance(target, int) or len(list(target)) == 1:
        w = h  # the shorter side: at least that square
    if h * w > MAX_IMAGE_PIXELS:
        src = "--resize" if pre.resize is not None else "the net's declared input size"
        raise DataError(f"images would be resized to {h}x{w} ({src}); at most "
                        f"{MAX_IMAGE_PIXELS} pixels per image are allowed", file=file)


class _NativeStderr:
    """Capture what native code (libpng, libjpeg inside OpenCV) writes to file descriptor 2
    while the block runs: a truncated PNG printed ``libpng error: ...`` before our own one-line
    error, and a damaged JPEG prints ``Corrupt JPEG data`` even when it decodes. ``text`` holds
    it afterwards; the decoder's failure then becomes one ``DataError`` that quotes it."""

    def __init__(self) -> None:
        self.text = ""
        self._saved: Optional[int] = None
        self._tmp: Any = None

    def __enter__(self) -> _NativeStderr:
        import sys
        import tempfile
        try:
            sys.stderr.flush()
            self._tmp = tempfile.TemporaryFile()
            self._saved = os.dup(2)
            os.dup2(self._tmp.fileno(), 2)
        except (OSError, ValueError, AttributeError):  # no fd 2 (embedded): nothing to hide
            self._close()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._saved is not None:
            os.dup2(self._saved, 2)
            self._tmp.seek(0)
            self.text = self._tmp.read(4096).decode("utf-8", "replace").strip()
        self._close()

    def _close(self) -> None:
        if self._saved is not None:
            os.close(self._saved)
            self._saved = None
        if self._tmp is not None:
            self._tmp.close()
            self._tmp = None


def _decoder_message(text: str) -> str:
    """The first line a native decoder printed, without its library prefix: for our error."""
    line = text.splitlines()[0].strip() if text else ""
    for prefix in ("libpng error:", "libpng warning:"):
        if line.startswith(prefix):
            line = line[len(prefix):].strip()
    return line[:200]


def load_image(path: str, pre: Preprocess, channels: int,
               target_hw: Optional[tuple[int, int]]) -> np.ndarray:
    """One image file as a float32 C×H×W array, preprocessed by ``pre``."""
    bound_opencv_decoding()
    import cv2

    check_regular_file(path, "image")
    try:
        check_png_chunks(path)
    except OSError as err:
        raise DataError(f"cannot read the image: {err.strerror or err}", file=path) from None
    size = image_size(path)
    if size is not None and size[0] * size[1] > MAX_IMAGE_PIXELS:
        raise DataError(f"the image is {size[1]}x{size[0]} pixels; at most {MAX_IMAGE_PIXELS} "
                        "pixels are read (a small file can declare a huge image)", file=path)
    flag = cv2.IMREAD_GRAYSCALE if channels == 1 else cv2.IMREAD_COLOR
    native = _NativeStderr()
    try:
        with native:
            img = cv2.imread(path, flag)
    except cv2.error as err:
        msg = str(err).strip().splitlines()[-1] if str(err).strip() else "OpenCV error"
        raise DataError(f"cannot read this image: {msg}", file=path) from None
    if img is not None and native.text:  # decoded, but damaged (a cut JPEG): say so, once
        note = _decoder_message(native.text)
        if note and note not in _DECODER_NOTES:
            _DECODER_NOTES.add(note)
            log.warning("%s: the image decoder reported %r (the image was read as decoded; "
                        "other images with the same report are not listed)", path, note)
    if img is None:
        why = _decoder_message(native.text)
        raise DataError("cannot read this file as an image (not an image, or corrupt"
                        + (f": {why})" if why else ")"), file=path)
    if img.ndim == 2:
        img = img[:, :, None]
    if channels not in (1, 3):
        raise DataError(f"the net takes {channels} input channels; images give 1 or 3", file=path)
    return _transform(img, pre, channels, target_hw, path)


def _transform(img: np.ndarray, pre: Preprocess, channels: int,
               target_hw: Optional[tuple[int, int]], path: str) -> np.ndarray:
    """The H×W×C image ``img`` through ``pre``'s steps, in its documented order: a float32
    C×H×W array."""
    resize = pre.resize if pre.resize is not None else (None if pre.crop is not None else target_hw)
    if resize is not None:
        if isinstance(resize, int) or len(list(resize)) == 1:
            short = _hw(resize)[0]
            h, w = img.shape[:2]
            f = short / min(h, w)
            rh, rw = max(1, round(h * f)), max(1, round(w * f))
        else:
            rh, rw = _hw(resize)
        if rh * rw > MAX_IMAGE_PIXELS:
            raise DataError(f"resizing this image gives {rw}x{rh} pixels; at most "
                            f"{MAX_IMAGE_PIXELS} are allowed", file=path)
        img = resize_hwc(img, rh, rw)
    if pre.crop is not None:
        ch, cw = _hw(pre.crop)
        h, w = img.shape[:2]
        if ch > h or cw > w:
            raise DataError(f"crop {ch}x{cw} is larger than the (resized) image {h}x{w}", file=path)
        img = img[centre_window(h, w, ch, cw)]
    if channels == 3 and pre.channel_order == "rgb":
        img = img[:, :, ::-1]
    mean = None
    if pre.mean is not None:
        mean = np.asarray(list(pre.mean), dtype=np.float32).reshape(-1)
        if mean.size not in (1, img.shape[2]):
            raise DataError(f"mean has {mean.size} values, the images have {img.shape[2]} channels")
    chw = img.transpose(2, 0, 1)
    return subtract_and_scale(chw, mean, np.float32(pre.scale), np.empty(chw.shape, np.float32))


#: numpy dtype kinds that are numbers a net can take (bool, ints, uints, floats)
_NUMERIC_KINDS = "biuf"


class ArrayFile:
    """One array of a ``.npy`` file or a ``.npz`` member, read lazily, rows on demand.

    Why: a 2 MB ``.npz`` of zeros can hold gigabytes; reading every member up front made the
    tool allocate all of it even for ``--batch-size 8 --batch-num 1``. ``.npy`` files are
    memory-mapped; ``.npz`` members are decompressed as a stream, row by row, and their
    declared size is checked against the member's real size before anything is read. The
    members of one ``.npz`` share one open archive (``archive``): opening the archive again
    per member parsed its whole directory each time, quadratic in the member count."""

    def __init__(self, path: str, member: Optional[str] = None, archive: Any = None) -> None:
        self.path = path
        self.member = member
        self._zip = archive
        self._stream: Optional[IO[bytes]] = None
        self._next_row = 0
        if member is None:
            check_regular_file(path, "array file")
            try:
                self._mm = np.load(path, mmap_mode="r", allow_pickle=False)
            except Exception as err:  # noqa: BLE001 - numpy's header parser raises SyntaxError,
                # tokenize.TokenError, ValueError... for a broken header: all are the user's file
                raise DataError(f"cannot read the array file: {type(err).__name__}: {err}",
                                file=path) from None
            if not isinstance(self._mm, np.ndarray):
                if hasattr(self._mm, "close"):
                    self._mm.close()
                raise DataError("not a .npy array file (a .npz archive?)", file=path)
            self.shape, self.dtype = tuple(self._mm.shape), self._mm.dtype
        else:
            self._mm = None
            self.shape, self.dtype, self._fortran, self._offset = self._npz_header()
        if self.dtype.kind not in _NUMERIC_KINDS:
            raise DataError(f"the array holds {self.dtype} values; calibration data must be "
                            "numbers (float or integer)", file=path)

    def _open_member(self) -> IO[bytes]:
        """The member as a file object (of the shared archive, opened on first use)."""
        import zipfile
        try:
            if self._zip is None:
                check_regular_file(self.path, ".npz file")
                self._zip = zipfile.ZipFile(self.path)
            return self._zip.open(self.member)
        except DataError:
            raise
        except Exception as err:  # noqa: BLE001 - bad zip, encrypted member, unknown method...
            raise DataError(f"cannot read the .npz file: {type(err).__name__}: {err}",
                            file=self.path) from None

    def _npz_header(self):
        f = self._open_member()
        z = self._zip
        try:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            else:
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
            offset = f.tell() if hasattr(f, "tell") else None
            size = z.getinfo(self.member).file_size
        except Exception as err:  # noqa: BLE001 - any header parse failure (see __init__)
            raise DataError(f"cannot read array '{self.member}' of the .npz file: "
                            f"{type(err).__name__}: {err}", file=self.path) from None
        finally:
            f.close()
        if dtype.kind in _NUMERIC_KINDS:
            need = int(np.prod(shape, dtype=object)) * dtype.itemsize
            if offset is not None and size - offset != need:
                raise DataError(f"array '{self.member}' declares shape {list(shape)} "
                                f"({need} bytes) but holds {size - offset} bytes", file=self.path)
        return tuple(shape), dtype, fortran, offset

    @property
    def rows_total(self) -> int:
        return int(self.shape[0]) if self.shape else 1

    def rows(self, start: int, count: int) -> np.ndarray:
        """Rows ``start``..``start+count`` (sequential for ``.npz`` members) as a new array."""
        if self._mm is not None:
            if not self.shape:
                return np.array(self._mm)
            return np.array(self._mm[start:start + count])
        if self._fortran or not self.shape:
            f = self._open_member()
            try:
                with f:
                    arr = np.lib.format.read_array(f, allow_pickle=False)
            except Exception as err:  # noqa: BLE001 - see __init__
                raise DataError(f"cannot read array '{self.member}' of the .npz file: "
                                f"{type(err).__name__}: {err}", file=self.path) from None
            return np.array(arr[start:start + count]) if self.shape else arr
        if self._stream is None or start != self._next_row:
            if self._stream is not None:
                self._stream.close()
            f = self._open_member()
            row_bytes = int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize
            try:
                f.read(self._offset)
                f.read(row_bytes * start)
            except Exception as err:  # noqa: BLE001 - see above
                raise DataError(f"cannot read array '{self.member}' of the .npz file: "
                                f"{type(err).__name__}: {err}", file=self.path) from None
            self._stream = f
        count = max(0, min(count, self.rows_total - start))
        row_bytes = int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize
        try:
            data = self._stream.read(row_bytes * count)
        except Exception as err:  # noqa: BLE001 - a corrupt deflate stream, a bad CRC...
            raise DataError(f"cannot read array '{self.member}' of the .npz file: "
                            f"{type(err).__name__}: {err}", file=self.path) from None
        if len(data) != row_bytes * count:
            raise DataError(f"array '{self.member}' is truncated", file=self.path)
        self._next_row = start + count
        return np.frombuffer(data, dtype=self.dtype).reshape((count,) + tuple(self.shape[1:])).copy()


def array_files(path: str) -> list[ArrayFile]:
    """The arrays of a .npy file, or of a .npz file (``inputs``, else ``data``, else every
    array in key order), opened lazily."""
    if path.lower().endswith(".npy"):
        return [ArrayFile(path)]
    import zipfile
    check_regular_file(path, ".npz file")
    try:
        z = zipfile.ZipFile(path)
        names = [n for n in z.namelist() if n.endswith(".npy")]
    except Exception as err:  # noqa: BLE001 - whatever zipfile raises on a broken archive
        raise DataError(f"cannot read the .npz file: {type(err).__name__}: {err}",
                        file=path) from None
    if not names:
        z.close()
        raise DataError("the .npz file holds no array", file=path)
    keys = [n[:-4] for n in names]
    wanted = ["inputs"] if "inputs" in keys else (["data"] if "data" in keys else sorted(keys))
    if len(wanted) > MAX_NPZ_MEMBERS:
        z.close()
        raise DataError(f"the .npz file holds {len(wanted)} arrays; at most {MAX_NPZ_MEMBERS} are "
                        "read (store the samples as one array, e.g. np.savez(f, inputs=batch))",
                        file=path)
    return [ArrayFile(path, k + ".npy", archive=z) for k in wanted]


def _array_chunks(arrays: Sequence[ArrayFile], spec: InputSpec, chunk: int
                  ) -> Iterator[tuple[np.ndarray, str]]:
    """Samples of lazily read arrays, ``chunk`` rows at a time (one sample when an array is
    one sample, i.e. has one dimension fewer than the declared input)."""
    for a in arrays:
        if spec.shape is not None and len(a.shape) == len(spec.shape) - 1:
            yield a.rows(0, 1), a.path
            continue
        spec.check_shape(list(a.shape), a.path)  # the whole array's shape, before reading
        for start in range(0, a.rows_total, max(1, chunk)):
            yield a.rows(start, chunk), a.path


def count_samples(data: Any, inputs: Sequence[tuple[str, Optional[Sequence[int]]]]) -> Optional[int]:
    """Samples in ``data`` without reading it (headers only): an array's first dimension, the
    rows of a .npy/.npz file, the files of an image folder; None for iterables."""
    shape = list(inputs[0][1]) if inputs and inputs[0][1] else None
    if hasattr(data, "shape") and len(data.shape) >= 1:
        return int(data.shape[0]) if shape is None or len(data.shape) == len(shape) else 1
    if not isinstance(data, (str, os.PathLike)):
        return None
    path = os.fspath(data)
    if len(inputs) > 1 and os.path.isfile(path):
        from amct_torch.inputs.named_arrays import named_npz_samples
        return named_npz_samples(path, inputs, ArrayFile)
    if os.path.isdir(path):
        total = 0
        for p in _files(path):
            if os.path.splitext(p)[1].lower() in ARRAY_EXTS:
                total += sum(_rows(a, shape) for a in array_files(p))
            else:
                total += 1
        return total
    if os.path.isfile(path) and os.path.splitext(path)[1].lower() in ARRAY_EXTS:
        return sum(_rows(a, shape) for a in array_files(path))
    return 1 if os.path.isfile(path) else None


def _rows(a: ArrayFile, shape: Optional[list]) -> int:
    if shape is not None and len(a.shape) == len(shape) - 1:
        return 1
    return a.rows_total


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

    def check_shape(self, shape: Sequence[int], source: str) -> None:
        """DataError naming ``source`` when a batch shape's rank or channels do not fit."""
        if self.shape is None:
            return
        want = "(" + ", ".join(["N"] + [str(d) for d in self.shape[1:]]) + ")"
        if len(shape) != len(self.shape) or (len(self.shape) >= 2 and shape[1] != self.shape[1]):
            raise DataError(f"input '{self.name}' expects batches shaped {want}, got "
                            f"{list(shape)}", file=source)

    def check(self, arr: Union[np.ndarray, torch.Tensor], source: str) -> torch.Tensor:
        """``arr`` as a float32 batch tensor of this input; DataError naming ``source`` when its
        rank or channel count does not fit the declared shape. H×W is not enforced: Caffe
        reshapes to the data and fully convolutional nets take any size (a net that cannot
        fails with a ModelError naming the layer)."""
        if not isinstance(arr, torch.Tensor):
            arr = np.asarray(arr)
            if arr.dtype.kind not in _NUMERIC_KINDS:
                raise DataError(f"input '{self.name}' data holds {arr.dtype} values; expected "
                                "numbers", file=source)
            # every numeric dtype, any byte order (a big-endian float64 .npy), as native float32
            # here: torch takes neither a foreign byte order nor every unsigned type
            wide = arr.dtype.kind == "f" and arr.dtype.itemsize > 4
            with np.errstate(over="ignore", invalid="ignore"):  # checked below, in one line
                narrow = arr.astype(np.float32, copy=False)
            if wide and not np.isfinite(narrow).all() and np.isfinite(arr[~np.isfinite(narrow)]).any():
                raise DataError(f"input '{self.name}' data holds {arr.dtype} values beyond float32's "
                                f"range (about ±3.4e38); the net computes in float32", file=source)
            arr = narrow
        t = arr if isinstance(arr, torch.Tensor) else torch.from_numpy(arr)
        if not (t.is_floating_point() or t.dtype in (torch.uint8, torch.int8, torch.int16, torch.int32,
                                                        torch.int64)):
            raise DataError(f"input '{self.name}' data has dtype {t.dtype}; expected numbers",
                            file=source)
        if self.shape is not None and t.dim() == len(self.shape) - 1:
            t = t.unsqueeze(0)
        self.check_shape(list(t.shape), source)
        if t.numel() == 0:
            raise DataError(f"input '{self.name}' got an empty batch", file=source)
        return t if t.dtype == torch.float32 else t.float()


def data_folder_files(folder: str) -> list[str]:
    """The files of a data folder in the order their samples are read."""
    return _files(folder)


def _files(folder: str) -> list[str]:
    """The regular files of a data folder (hidden ones and sub-folders skipped); a FIFO,
    device or socket in it is a DataError naming it (reading it could block forever)."""
    import stat
    try:
        names = sorted(n for n in os.listdir(folder) if not n.startswith("."))
    except OSError as err:
        raise DataError(f"cannot list the data folder: {err.strerror or err}", file=folder) from None
    paths = []
    for n in names:
        p = os.path.join(folder, n)
        try:
            mode = os.stat(p).st_mode
        except OSError:
            continue  # a dangling link: not a file of the folder
        if stat.S_ISREG(mode):
            paths.append(p)
        elif not stat.S_ISDIR(mode):
            raise DataError(f"the data folder holds {file_kind(mode)}, not a regular file; it is "
                            "not read (reading it could block forever)", file=p)
    if not paths:
        raise DataError("the data folder has no files", file=folder)
    return paths


def _folder_samples(folder: str, pre: Preprocess, spec: InputSpec, chunk: int = 1
                    ) -> Iterator[tuple[np.ndarray, str]]:
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
            yield from _array_chunks(array_files(p), spec, chunk)


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
    if batch_size is not None and (isinstance(batch_size, bool) or int(batch_size) < 1):
        raise DataError(f"batch size must be >= 1, got {batch_size!r}")
    bs = int(batch_size) if batch_size is not None else 1
    if isinstance(data, (str, os.PathLike)):
        path = os.fspath(data)
        if len(specs) != 1:  # one .npz holding an array per input, named after it
            from amct_torch.inputs.named_arrays import named_npz_batches
            return named_npz_batches(path, specs, bs, ArrayFile)
        if os.path.isdir(path):
            return _batched(_folder_samples(path, pre, specs[0], bs), bs, specs[0])
        check_regular_file(path, "calibration data")
        ext = os.path.splitext(path)[1].lower()
        if ext in ARRAY_EXTS:
            return _batched(_array_chunks(array_files(path), specs[0], bs), bs, specs[0])
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
        src = f"<batch {i + 1}>"  # counted from 1 in every message
        if isinstance(item, (tuple, list)) and len(specs) > 1:
            if len(item) != len(specs):
                raise DataError(f"batch {i + 1} has {len(item)} inputs, the net takes {len(specs)}")
            yield tuple(s.check(a, src) for s, a in zip(specs, item))
        elif isinstance(item, (tuple, list)) and len(item) >= 1 and \
                isinstance(item[0], (np.ndarray, torch.Tensor)) and len(specs) == 1 and \
                not isinstance(item, list):
            # (inputs, labels) pairs from a DataLoader: the first element is the input.
            yield specs[0].check(item[0], src)
        else:
            if len(specs) > 1:
                raise DataError(f"batch {i + 1} is one array but the net takes {len(specs)} inputs")
            yield specs[0].check(item, src)
