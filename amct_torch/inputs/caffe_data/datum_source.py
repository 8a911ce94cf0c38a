"""Caffe's ``Data`` layer (a database of Datum records) and the SSD fork's ``AnnotatedData``
layer (a database of AnnotatedDatum records), TEST phase.

Tops: the transformed images (N×C×H×W) and, given a second top, the labels: ``Data`` gives
each Datum's ``label`` (shape (N,)); ``AnnotatedData`` with box annotations gives the fork's
1×1×B×8 rows ``[item, group_label, instance_id, xmin, ymin, xmax, ymax, difficult]`` (boxes
projected onto the centre crop and clipped as the fork does; B varies per batch, one row of
-1 when a batch has no box), without annotations each datum's ``label``.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Optional

import numpy as np

from amct_torch.errors import DataError
from amct_torch.inputs.caffe_data.databases import Database, key_text, open_database
from amct_torch.inputs.caffe_data.datum import datum_pixels, parse_datum, parse_record
from amct_torch.inputs.caffe_data.source import RecordSource
from amct_torch.inputs.caffe_data.transformer import DataTransformer
from amct_torch.proto import amct_caffe_pb2 as pb


class DatumSource(RecordSource):
    """The ``Data`` / ``AnnotatedData`` layer ``layer`` reading the database at ``path``."""

    def __init__(self, layer: pb.LayerParameter, path: str, transformer: DataTransformer,
                 *, annotated: bool = False, threads: Optional[int] = None) -> None:
        dp = layer.data_param
        tops = tuple(layer.top)
        kind = "AnnotatedData" if annotated else "Data"
        if len(tops) not in (1, 2):
            raise DataError(f"a {kind} layer has 1 or 2 tops (data, label), this one has "
                            f"{len(tops)}", layer=layer.name)
        if not dp.HasField("batch_size"):
            raise DataError("data_param batch_size is not given", layer=layer.name)
        backend = pb.DataParameter.DB.Name(dp.backend)
        self.db: Database = open_database(path, backend, layer.name)
        try:
            self._setup(layer, path, transformer, annotated, threads)
        except BaseException:
            self.db.close()  # a LevelDB stays locked while open
            raise

    def _setup(self, layer: pb.LayerParameter, path: str, transformer: DataTransformer,
               annotated: bool, threads: Optional[int]) -> None:
        tops = tuple(layer.top)
        super().__init__(layer.name, tops, layer.data_param.batch_size, self.db.count,
                         file=path, threads=threads)
        self.transformer, self.annotated = transformer, annotated
        self._rows: dict[tuple[int, int], list[list[float]]] = {}
        key, value = self.db.first_value()
        first = self._parse(key, value)
        datum = first.datum if annotated else first
        where = f"key '{key_text(key)}'"
        px = datum_pixels(datum, transformer.decode_mode, where, path)
        shape = transformer.output_shape(*px.chw, where=where, file=path)
        self._boxes = annotated and first.HasField("type") or (
            annotated and layer.annotated_data_param.HasField("anno_type"))
        label_shape: tuple[int, ...] = ()
        if self._boxes:
            self.batch_label_shape = (1, 1, max(1, _box_count(first)), 8)
        self._item_shapes = [shape] + ([label_shape] if len(tops) == 2 else [])
        self._check_batch_bytes()

    def top_shapes(self) -> list[tuple[int, ...]]:
        shapes = super().top_shapes()
        if self._boxes and len(shapes) == 2:
            shapes[1] = self.batch_label_shape
        return shapes

    def _parse(self, key: bytes, value: bytes) -> Any:
        where = f"key '{key_text(key)}'"
        if not self.annotated:
            return parse_datum(value, where, self.file)
        return parse_record(pb.AnnotatedDatum(), value, where, self.file)

    def _records(self, first: int) -> Iterator[tuple[bytes, bytes]]:
        return self.db.records(first)

    def _fill(self, record: tuple[bytes, bytes], outs: dict[str, np.ndarray], i: int) -> None:
        key, value = record
        where = f"key '{key_text(key)}'"
        rec = self._parse(key, value)
        datum = rec.datum if self.annotated else rec
        px = datum_pixels(datum, self.transformer.decode_mode, where, self.file)
        self.transformer.apply(px, outs[self.tops[0]][i], where, self.file)
        if len(self.tops) == 2 and not self._boxes:
            outs[self.tops[1]][i] = datum.label
        elif len(self.tops) == 2:
            _, h, w = px.chw
            self._rows[(id(outs), i)] = _box_rows(rec, i, self.transformer, (h, w),
                                                  outs[self.tops[0]].shape[2:])

    def _finish(self, outs: dict[str, np.ndarray], records: list[Any]) -> dict[str, np.ndarray]:
        if not (self._boxes and len(self.tops) == 2):
            return outs
        rows = [r for i in range(len(records)) for r in self._rows.pop((id(outs), i))]
        outs[self.tops[1]] = (np.asarray(rows, np.float32) if rows else
                              np.full((1, 8), -1, np.float32)).reshape(1, 1, -1, 8)
        return outs

    def close(self) -> None:
        super().close()
        self.db.close()


def _box_count(anno: pb.AnnotatedDatum) -> int:
    return sum(len(g.annotation) for g in anno.annotation_group)


def _box_rows(anno: pb.AnnotatedDatum, item: int, t: DataTransformer, hw: tuple[int, int],
              out_hw: tuple[int, ...]) -> list[list[float]]:
    """The label rows of one AnnotatedDatum's boxes as the fork's TransformAnnotation makes
    them, in float32: moved by the WARP resize (UpdateBBoxByResizePolicy), projected onto the
    centre crop of the ``hw`` image and clipped to [0, 1] (ProjectBBox); boxes outside the
    crop or of no area are dropped."""
    f = np.float32
    ih, iw = (t.resize[0], t.resize[1]) if t.resize else hw
    oh, ow = int(out_hw[0]), int(out_hw[1])
    h0, w0 = (ih - oh) // 2, (iw - ow) // 2
    crop = (f(w0) / f(iw), f(h0) / f(ih), f(w0 + ow) / f(iw), f(h0 + oh) / f(ih))
    old_h, old_w = (anno.datum.height, anno.datum.width) if anno.datum.height > 0 and \
        anno.datum.width > 0 else hw
    rows = []
    for group in anno.annotation_group:
        for a in group.annotation:
            b = a.bbox
            x0, y0, x1, y1 = f(b.xmin), f(b.ymin), f(b.xmax), f(b.ymax)
            if t.resize is not None:  # WARP
                nh, nw, oh_f, ow_f = f(t.resize[0]), f(t.resize[1]), f(old_h), f(old_w)
                x0 = max(f(0), x0 * ow_f * nw / ow_f) / nw
                x1 = min(nw, x1 * ow_f * nw / ow_f) / nw
                y0 = max(f(0), y0 * oh_f * nh / oh_f) / nh
                y1 = min(nh, y1 * oh_f * nh / oh_f) / nh
            if x0 >= crop[2] or x1 <= crop[0] or y0 >= crop[3] or y1 <= crop[1]:
                continue
            cw, ch = crop[2] - crop[0], crop[3] - crop[1]
            box = [min(max(v, f(0)), f(1)) for v in ((x0 - crop[0]) / cw, (y0 - crop[1]) / ch,
                                                     (x1 - crop[0]) / cw, (y1 - crop[1]) / ch)]
            if box[2] < box[0] or box[3] < box[1] or (box[2] - box[0]) * (box[3] - box[1]) <= 0:
                continue
            rows.append([item, group.group_label, a.instance_id, *map(float, box),
                         float(b.difficult)])
    return rows
