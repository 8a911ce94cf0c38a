"""The record's text is protobuf's: the printer gives exactly what protobuf prints for a
message built here field by field, and the reader gives exactly what protobuf reads (or a
``RecordError`` where protobuf refuses the text) -- on printed, reformatted and corrupted
records."""
from __future__ import annotations

import dataclasses

from google.protobuf import text_format
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amct_torch.config.textproto import join_multiline_strings
from amct_torch.errors import RecordError
from amct_torch.proto import scale_offset_record_pb2 as pb
from amct_torch.record import LayerRecord, format_record, parse_record_text
from helpers.corrupt import corrupt_text
from helpers.record_strategies import records_st

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def to_message(records: dict) -> pb.ScaleOffsetRecord:
    """The reference message, built here from the schema rather than by the library's writer:
    every ``LayerRecord`` field goes to the ``SingleLayerRecord`` field of the same name (lists
    extended, scalars set unless None, the flag set only when true; a field the schema lacks
    raises)."""
    msg = pb.ScaleOffsetRecord()
    for name, r in records.items():
        v = msg.record.add(key=name).value
        for f in dataclasses.fields(r):
            x = getattr(r, f.name)
            if isinstance(x, list):
                getattr(v, f.name).extend(x)
            elif x is not None and x is not False:
                setattr(v, f.name, x)
    return msg


def protobuf_entries(text: str):
    """protobuf's reading of ``text`` as [(key, LayerRecord)], or None when it refuses it."""
    msg = pb.ScaleOffsetRecord()
    try:
        text_format.Merge(join_multiline_strings(text), msg)
    except (text_format.ParseError, ValueError, TypeError, UnicodeError):
        return None
    out = []
    for e in msg.record:
        v = e.value
        out.append((e.key if e.HasField("key") else None, LayerRecord(
            v.scale_d if v.HasField("scale_d") else None,
            v.offset_d if v.HasField("offset_d") else None, list(v.scale_w), list(v.offset_w),
            list(v.shift_bit), v.channels if v.HasField("channels") else None,
            v.height if v.HasField("height") else None, v.width if v.HasField("width") else None,
            v.skip_fusion)))
    return out


def same(a, b) -> bool:
    """Equality that treats nan == nan and tells -0.0 from 0.0 (repr-based)."""
    return repr(a) == repr(b)


def ours(text: str):
    """Our reading of ``text`` as [(key, LayerRecord)], or None when it raises RecordError."""
    try:
        return list(parse_record_text(text, "r.txt").items())
    except RecordError as err:
        assert err.file == "r.txt"
        return None


@SETTINGS
@given(records_st)
def test_printer_is_byte_identical_to_protobuf(records):
    assert format_record(records) == text_format.MessageToString(to_message(records))


@SETTINGS
@given(records_st)
def test_reader_matches_protobuf_on_printed_records(records):
    text = text_format.MessageToString(to_message(records))
    assert same(ours(text), protobuf_entries(text))


LAYOUT = st.sampled_from([" ", "\n", "  ", "\n\t", " \n "])


@SETTINGS
@given(records_st, st.data())
def test_reader_matches_protobuf_on_reformatted_and_corrupted_text(records, data):
    text = text_format.MessageToString(to_message(records), as_one_line=data.draw(st.booleans()))
    if data.draw(st.booleans()):
        text = text.replace("value {", "value: {").replace(" ", data.draw(LAYOUT))
    text = corrupt_text(text, data) if data.draw(st.booleans()) else text
    ref = protobuf_entries(text)
    got = ours(text)
    if ref is None:
        assert got is None
    elif got is None:  # refused beyond protobuf: an entry without key, or a key given twice
        keys = [k for k, _ in ref]
        assert not all(keys) or len(set(keys)) < len(keys)
    else:
        assert same(got, ref)


def test_key_split_over_lines_is_read_whole():
    text = 'record {\nkey: "\nconv1\n"\nvalue: {\nscale_d: 0.01424\nchannels:3\n}\n}\n'
    assert same(ours(text), [("conv1", LayerRecord(scale_d=0.014240000396966934, channels=3))])
