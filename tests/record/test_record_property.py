"""Property-based tests of the record file: any representable record survives write -> read
exactly (float32), and random corruptions of a valid file give RecordError, never another
exception."""
from __future__ import annotations

import math
import os

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amct_torch.errors import RecordError
from amct_torch.record import (
    LayerRecord,
    as_stored,
    format_record,
    parse_record_text,
    read_record,
    validate_record,
    write_record,
)
from helpers.configs import LAYERS
from helpers.corrupt import corrupt_text
from helpers.record_strategies import records_st

SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@SETTINGS
@given(records_st)
def test_write_read_round_trip_is_exact(tmp_path, records):
    path = os.path.join(tmp_path, "r.txt")
    write_record(path, records)
    back = read_record(path)
    assert list(back) == list(records)
    for name, r in records.items():
        b = back[name]
        assert np.array_equal(np.float32(b.scale_w), np.float32(r.scale_w))
        assert (b.scale_d is None) == (r.scale_d is None)
        if r.scale_d is not None:
            assert np.float32(b.scale_d) == np.float32(r.scale_d) and \
                math.copysign(1, b.scale_d) == math.copysign(1, r.scale_d)
        assert (b.offset_d, b.offset_w, b.shift_bit, b.channels, b.height, b.width, b.skip_fusion) == \
            (r.offset_d, r.offset_w, r.shift_bit, r.channels, r.height, r.width, r.skip_fusion)


@SETTINGS
@given(records_st)
def test_a_record_kept_in_memory_holds_what_the_file_would(tmp_path, records):
    """``as_stored`` (what the one-call job computes from, never reading its record back) is
    exactly what writing and reading the file gives."""
    path = os.path.join(tmp_path, "r.txt")
    write_record(path, records)
    assert repr(as_stored(records)) == repr(read_record(path))


def _valid() -> dict:
    return {"conv1": LayerRecord(0.0123, -5, [0.5] * 8, [0] * 8, [], 3, 16, 16, True),
            "pool1": LayerRecord(0.3, 127, channels=8, height=8, width=8),
            "fc1": LayerRecord(0.4, -128, [0.25], [0], [0], 64, 1, 1)}


@SETTINGS
@given(st.data())
def test_corrupted_record_gives_record_error_or_valid_record(data):
    text = corrupt_text(format_record(_valid()), data)
    try:
        validate_record(parse_record_text(text, "c.txt"), LAYERS, "c.txt")
    except RecordError as e:
        assert e.file == "c.txt"
