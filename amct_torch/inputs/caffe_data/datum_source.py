"""Caffe's ``Data`` layer (a database of Datum records) and the SSD fork's ``AnnotatedData``
layer (a database of AnnotatedDatum records), TEST phase.

Tops: the transformed images (N×C×H×W) and, given a second top, the labels: ``Data`` gives
each Datum's ``label`` (shape (N,)); ``AnnotatedData`` with box annotations gives the fork's
1×1×B×8 rows ``[item, group_label, instance_id, xmin, ymin, xmax, ymax, difficult]`` (boxes
projected onto the centre crop and clipped as the fork does; B varies per batch, one row of
-1 when a batch has no box), without annotations each datum's ``label``.
"""
from __future__ import annotations

from typing import Any, Iterator, Optional

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
        super().__init__(layer.name, tops, dp.batch_size, self.db.count, file=path,
                         threads=threads)
        self.transformer, self.annotated = transformer, annotated
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

    def _finish(self, outs: dict[str, np.ndarray], records: list[Any]) -> dict[str, np.ndarray]:
        if not (self._boxes and len(self.tops) == 2):
            return outs
        rows: list[list[float]] = []
        for item, (key, value) in enumerate(records):
            anno = self._parse(key, value)
            rows.extend(_box_rows(anno, item, self._crop_box(anno)))
        outs[self.tops[1]] = (np.asarray(rows, np.float32) if rows else
                              np.full((1, 8), -1, np.float32)).reshape(1, 1, -1, 8)
        return outs

    def _crop_box(self, anno: "pb.AnnotatedDatum") -> tuple[float, float, float, float]:
        """The centre crop as a normalized box of the (resized) image."""
        t = self.transformer
        if t.crop is None:
            return (0.0, 0.0, 1.0, 1.0)
        _, h, w = self._item_shapes[0]
        ih, iw = (t.resize[0], t.resize[1]) if t.resize else (anno.datum.height,
                                                              anno.datum.width)
        if ih < 1 or iw < 1:
            return (0.0, 0.0, 1.0, 1.0)
        h0, w0 = (ih - h) // 2, (iw - w) // 2
        return (np.float32(w0 / iw), np.float32(h0 / ih), np.float32((w0 + w) / iw),
                np.float32((h0 + h) / ih))

    def close(self) -> None:
        super().close()
        self.db.close()


def _box_count(anno: "pb.AnnotatedDatum") -> int:
    return sum(len(g.annotation) for g in anno.annotation_group)


def _box_rows(anno: "pb.AnnotatedDatum", item: int,
              crop: tuple[float, float, float, float]) -> list[list[float]]:
    """The label rows of one AnnotatedDatum's boxes, projected onto ``crop`` and clipped to
    [0, 1]; boxes outside the crop or of no area are dropped (the fork's ProjectBBox)."""
    cx0, cy0, cx1, cy1 = crop
    cw, ch = cx1 - cx0, cy1 - cy0
    rows = []
    for group in anno.annotation_group:
        for a in group.annotation:
            b = a.bbox
            if b.xmin >= cx1 or b.xmax <= cx0 or b.ymin >= cy1 or b.ymax <= cy0:
                continue
            box = [min(max(v, 0.0), 1.0) for v in ((b.xmin - cx0) / cw, (b.ymin - cy0) / ch,
                                                   (b.xmax - cx0) / cw, (b.ymax - cy0) / ch)]
            if box[2] < box[0] or box[3] < box[1] or (box[2] - box[0]) * (box[3] - box[1]) <= 0:
                continue
            rows.append([item, group.group_label, a.instance_id, *box, float(b.difficult)])
    return rows
