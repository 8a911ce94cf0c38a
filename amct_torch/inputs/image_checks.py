"""Checks on an image file (a path, or its bytes) before OpenCV decodes it: the size its header
declares and a PNG's chunk lengths, so that a small forged file cannot make the decoder
allocate gigabytes. Torch-free (the Caffe data readers use it too)."""
from __future__ import annotations

import os
from typing import Any, Optional, Union

from amct_torch.errors import DataError

#: largest image read, and largest image a resize may produce (documented in docs/workflow.md)
#: 50 megapixels (150 MB as 8-bit BGR, 600 MB as float32)
MAX_IMAGE_PIXELS = 50_000_000


def bound_opencv_decoding() -> None:
    """Cap OpenCV's decoders at ``MAX_IMAGE_PIXELS`` (read when ``cv2`` is first imported,
    so call this before that import)."""
    os.environ.setdefault("OPENCV_IO_MAX_IMAGE_PIXELS", str(MAX_IMAGE_PIXELS))


def _open_binary(source: Union[str, bytes, memoryview]) -> Any:
    """A binary file object over a path or over the bytes themselves (an encoded image held in
    a database record)."""
    import io
    return open(source, "rb") if isinstance(source, str) else io.BytesIO(source)


def image_size(path: Union[str, bytes, memoryview]) -> Optional[tuple[int, int]]:
    """(width, height) from a PNG, JPEG, BMP or GIF header (a file's path, or its bytes)
    without decoding; None when the format is not one of those or the header is unreadable
    (OpenCV then decides)."""
    import struct
    try:
        with _open_binary(path) as f:
            head = f.read(32)
            if head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR":
                return struct.unpack(">II", head[16:24])
            if head[:2] == b"BM" and len(head) >= 26:
                w, h = struct.unpack("<ii", head[18:26])
                return abs(w), abs(h)
            if head[:6] in (b"GIF87a", b"GIF89a"):
                return struct.unpack("<HH", head[6:10])
            if head[:2] == b"\xff\xd8":
                f.seek(2)
                for _ in range(10000):
                    marker = f.read(2)
                    if len(marker) < 2 or marker[0] != 0xFF:
                        return None
                    if marker[1] in (0xD8, 0x01) or 0xD0 <= marker[1] <= 0xD7:
                        continue
                    length = struct.unpack(">H", f.read(2))[0]
                    if 0xC0 <= marker[1] <= 0xCF and marker[1] not in (0xC4, 0xC8, 0xCC):
                        h, w = struct.unpack(">xHH", f.read(5))
                        return w, h
                    f.seek(length - 2, 1)
    except (OSError, struct.error):
        return None
    return None


def check_png_chunks(path: Union[str, bytes, memoryview], name: Optional[str] = None) -> None:
    """Refuse a PNG (a file's path, or its bytes, then called ``name`` in the error) whose chunk
    lengths exceed the file (OpenCV's PNG reader allocates what a chunk header claims: a
    70-byte file claiming a 3.8 GB IDAT took 3.7 GB)."""
    import struct
    size = os.path.getsize(path) if isinstance(path, str) else len(path)
    where = path if isinstance(path, str) else name
    with _open_binary(path) as f:
        if f.read(8) != b"\x89PNG\r\n\x1a\n":
            return
        pos = 8
        while pos + 8 <= size:
            head = f.read(8)
            if len(head) < 8:
                return
            length = struct.unpack(">I", head[:4])[0]
            if length > size - pos - 12:
                raise DataError(f"corrupt PNG: a chunk claims {length} bytes at offset {pos}, the "
                                f"file has {size} bytes", file=where)
            if head[4:8] == b"IEND":
                return
            f.seek(length + 4, 1)
            pos += 12 + length
