"""Caffe's ``ImageData`` layer: a list file of "path label" lines, images read with OpenCV.

As Caffe's ImageDataLayer: a line splits at its last space (paths may hold spaces), the label
is the integer that follows (C ``atoi``); images are ``root_folder`` + path, read in colour
(BGR) or, with ``is_color: false``, grey, resized to ``new_height`` × ``new_width`` with
``cv2.resize``'s default (bilinear) when both are given, then transformed. Blank lines are
skipped; every named image must exist (checked when the source opens; a relative one not
found from the working directory is looked up beside the prototxt). ``shuffle`` and
``rand_skip`` are random in Caffe and not applied: the list is read in order.
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Optional

import numpy as np

from amct_torch.errors import DataError
from amct_torch.inputs.caffe_data.datum import Pixels
from amct_torch.inputs.caffe_data.optional_deps import require
from amct_torch.inputs.caffe_data.source import RecordSource
from amct_torch.inputs.caffe_data.transformer import DataTransformer
from amct_torch.inputs.image_checks import MAX_IMAGE_PIXELS, check_png_chunks, image_size
from amct_torch.inputs.limits import check_regular_file
from amct_torch.inputs.transform import resize_hwc
from amct_torch.proto import amct_caffe_pb2 as pb

#: largest list file read
MAX_LIST_BYTES = 1 << 30
_ATOI = re.compile(r"\s*([+-]?\d+)")


def atoi(text: str) -> int:
    """C's atoi: the leading integer of ``text``, 0 when there is none."""
    m = _ATOI.match(text)
    return int(m.group(1)) if m else 0


def read_list(path: str) -> list[tuple[str, int, int]]:
    """(image path, label, line number) of each non-blank line of an ImageData list file."""
    check_regular_file(path, "image list file")
    if os.path.getsize(path) > MAX_LIST_BYTES:
        raise DataError(f"the list file is larger than {MAX_LIST_BYTES} bytes", file=path)
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        lines = f.read().split("\n")
    entries = []
    for n, line in enumerate(lines, 1):
        line = line.rstrip("\r")
        if not line.strip():
            continue
        pos = line.rfind(" ")
        name, label = (line[:pos], atoi(line[pos + 1:])) if pos >= 0 else (line, atoi(line))
        entries.append((name, label, n))
    if not entries:
        raise DataError("the image list is empty", file=path)
    return entries


class ImageListSource(RecordSource):
    """The ``ImageData`` layer ``layer`` reading the list file ``path``."""

    def __init__(self, layer: pb.LayerParameter, path: str, transformer: DataTransformer,
                 *, base_dir: Optional[str] = None, threads: Optional[int] = None) -> None:
        p = layer.image_data_param
        tops = tuple(layer.top)
        if len(tops) not in (1, 2):
            raise DataError(f"an ImageData layer has 1 or 2 tops (data, label), this one has "
                            f"{len(tops)}", layer=layer.name)
        if (p.new_height > 0) != (p.new_width > 0):
            raise DataError("image_data_param needs new_height and new_width together",
                            layer=layer.name)
        self.entries = read_list(path)
        super().__init__(layer.name, tops, p.batch_size, len(self.entries), file=path,
                         threads=threads)
        self.root, self.is_color = p.root_folder, p.is_color
        self.new_hw = (p.new_height, p.new_width) if p.new_height > 0 else None
        if self.new_hw and self.new_hw[0] * self.new_hw[1] > MAX_IMAGE_PIXELS:
            raise DataError(f"new_height x new_width is {self.new_hw[0]}x{self.new_hw[1]}",
                            layer=layer.name)
        self.paths = [self._locate(name, line, base_dir) for name, _, line in self.entries]
        self.transformer = transformer
        px = self._read((0, 0, self.entries[0][2]))
        self._item_shapes = [transformer.output_shape(
            *px.chw, where=f"line {self.entries[0][2]}", file=path)]
        if len(tops) == 2:
            self._item_shapes.append(())
        self._check_batch_bytes()

    def _locate(self, name: str, line: int, base_dir: Optional[str]) -> str:
        """``root_folder + name`` as Caffe opens it, else relative to ``base_dir``."""
        path = self.root + name
        if os.path.isfile(path):
            return path
        if base_dir and not os.path.isabs(path) and os.path.isfile(os.path.join(base_dir, path)):
            return os.path.join(base_dir, path)
        raise DataError(f"the image '{path}' does not exist", file=self.file, line=line,
                        layer=self.name)

    def _read(self, entry: tuple[int, int, int]) -> Pixels:
        cv2 = require("cv2", "ImageData images", self.file)
        index, _, line = entry
        path = self.paths[index]
        try:
            check_regular_file(path, "image")
            check_png_chunks(path)
            size = image_size(path)
        except (DataError, OSError) as err:
            raise DataError(f"image '{path}': {getattr(err, 'message', err)}", file=self.file,
                            line=line, layer=self.name) from None
        if size is not None and size[0] * size[1] > MAX_IMAGE_PIXELS:
            raise DataError(f"the image '{path}' is {size[1]}x{size[0]} pixels; at most "
                            f"{MAX_IMAGE_PIXELS} are read", file=self.file, line=line)
        img = cv2.imread(path, cv2.IMREAD_COLOR if self.is_color else cv2.IMREAD_GRAYSCALE)
        if img is None:
            raise DataError(f"cannot read the image '{path}' (not an image, or corrupt)",
                            file=self.file, line=line, layer=self.name)
        if self.new_hw is not None:
            img = resize_hwc(img, *self.new_hw)
        return Pixels(img[:, :, None] if img.ndim == 2 else img, hwc=True)

    def _records(self, first: int) -> Iterator[tuple[int, int, int]]:
        """(entry number, label, line number) of each image in turn."""
        n = len(self.entries)
        i = first % n
        while True:
            yield i, self.entries[i][1], self.entries[i][2]
            i = (i + 1) % n

    def _fill(self, record: tuple[int, int, int], outs: dict[str, np.ndarray], i: int) -> None:
        px = self._read(record)
        self.transformer.apply(px, outs[self.tops[0]][i], f"line {record[2]}", self.file)
        if len(self.tops) == 2:
            outs[self.tops[1]][i] = record[1]
