"""Record file reading, writing and atomic merging (docs/config_and_record.md, "Record")."""
from __future__ import annotations

import os

import numpy as np
import pytest

from amct_torch.errors import AmctError, RecordError
from amct_torch.record import (
    LayerRecord,
    add_activation_factors,
    add_weight_factors,
    empty_record,
    format_record,
    merge_activation_factors,
    parse_record_text,
    read_record,
    write_record,
    write_weight_factors,
)
from helpers.configs import DATA, write


def f32(x: float) -> float:
    return float(np.float32(x))


def test_seed_record_parses_as_conv1_pool1_fc1():
    recs = read_record(os.path.join(DATA, "seed000_record.txt"))
    assert list(recs) == ["conv1", "pool1", "fc1"]
    assert recs["conv1"] == LayerRecord(scale_d=f32(0.01424), offset_d=-128,
                                        scale_w=[f32(0.43213), f32(0.78163), f32(1.03213)],
                                        offset_w=[0, 0, 0], shift_bit=[1, 1, 1], channels=3,
                                        height=144, width=144, skip_fusion=True)
    assert recs["pool1"] == LayerRecord(scale_d=f32(0.532532), offset_d=13, channels=256,
                                        height=32, width=32)
    assert recs["fc1"] == LayerRecord(scale_d=f32(0.37532), offset_d=-67, scale_w=[f32(0.876221)],
                                      offset_w=[0], shift_bit=[1], channels=1024, height=1, width=1)


def test_write_then_read_is_float32_exact(tmp_path):
    rng = np.random.default_rng(1)
    recs = {}
    for i in range(20):
        sw = (rng.random(5) * 10.0 ** rng.integers(-8, 4)).astype(np.float32)
        recs[f"layer/{i} \"q\""] = LayerRecord(
            scale_d=float(np.float32(rng.random() * 1e-3)), offset_d=int(rng.integers(-128, 128)),
            scale_w=[float(s) for s in sw], offset_w=[0] * 5, channels=i + 1, height=7, width=9,
            skip_fusion=bool(i % 2))
    path = str(tmp_path / "r.txt")
    write_record(path, recs)
    assert read_record(path) == recs


def test_skip_fusion_written_only_when_true(tmp_path):
    path = str(tmp_path / "r.txt")
    write_record(path, {"a": LayerRecord(scale_d=1.0, offset_d=0, skip_fusion=True),
                        "b": LayerRecord(scale_d=1.0, offset_d=0)})
    text = open(path).read()
    assert text.count("skip_fusion") == 1
    assert read_record(path)["a"].skip_fusion and not read_record(path)["b"].skip_fusion


def test_weights_first_then_activations_merged(tmp_path):
    path = str(tmp_path / "r.txt")
    empty_record(path)
    assert read_record(path) == {}
    write_weight_factors(path, {"conv1": ([0.5, 0.25], [0, 0]), "fc1": ([2.0], [0])},
                         skip_fusion=["conv1"])
    merge_activation_factors(path, {"fc1": (0.125, -3, 64, 1, 1), "pool1": (0.5, 7, 8, 4, 4),
                                    "conv1": (0.0625, 12, 3, 32, 32)})
    recs = read_record(path)
    assert list(recs) == ["conv1", "fc1", "pool1"]        # existing order kept, new appended
    assert recs["conv1"] == LayerRecord(0.0625, 12, [0.5, 0.25], [0, 0], [], 3, 32, 32, True)
    assert recs["fc1"] == LayerRecord(0.125, -3, [2.0], [0], [], 64, 1, 1, False)
    assert recs["pool1"] == LayerRecord(0.5, 7, [], [], [], 8, 4, 4, False)
    # merging again replaces the activation factors only
    merge_activation_factors(path, {"conv1": (0.25, -1, 3, 32, 32)})
    again = read_record(path)
    assert again["conv1"].scale_d == 0.25 and again["conv1"].scale_w == [0.5, 0.25]
    assert again["fc1"] == recs["fc1"]


def test_in_memory_merges_write_what_the_file_merges_write(tmp_path):
    """The steps merge in memory and write once; AMCT's API merges into the file: same bytes.
    The dict merged into is left as it was."""
    path = str(tmp_path / "r.txt")
    weights = {"b": ([0.3, 0.7], [0, 0]), "a": ([2.0], [0])}
    acts = {"a": (0.1, -3, 64, 1, 1), "elt": (0.2, 5, None, None, None), "b": (1 / 3, 0, 3, 8, 8)}
    write_weight_factors(path, weights, skip_fusion=["b"])
    merge_activation_factors(path, acts)
    first = add_weight_factors({}, weights, skip_fusion=["b"])
    kept = repr(first)
    both = add_activation_factors(first, acts)
    assert repr(first) == kept and first["a"].scale_d is None
    assert format_record(both) == open(path).read()
    assert list(both) == ["b", "a", "elt"]


def test_merge_into_missing_file_creates_it(tmp_path):
    path = str(tmp_path / "new.txt")
    merge_activation_factors(path, {"x": (1.5, 0, 1, 2, 3)})
    assert read_record(path) == {"x": LayerRecord(1.5, 0, channels=1, height=2, width=3)}


def test_crash_during_write_leaves_old_record_intact(tmp_path, monkeypatch):
    """The temp file is fully written, then the rename fails (as a crash or full disk would
    stop it): the old record must be untouched and no temp file left behind."""
    path = str(tmp_path / "r.txt")
    write_weight_factors(path, {"conv1": ([0.5], [0])})
    before = open(path).read()

    def boom(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(AmctError, match="no space left") as err:  # one line naming the record
        merge_activation_factors(path, {"conv1": (1.0, 0, 3, 4, 4)})
    monkeypatch.undo()
    assert err.value.file == path
    assert open(path).read() == before
    assert sorted(os.listdir(tmp_path)) == ["r.txt"]


@pytest.mark.parametrize("text,expect,layer", [
    ('record { key: "a" value { scale_d: 1 } }\nrecord { key: "a" value { } }',
     "layer appears more than once in the record", "a"),
    ("record { value { scale_d: 1 } }", "record entry #1 has no key (layer name)", None),
    ('record { key: "a" value { offset_d: 1.5 } }', None, None),
    ('record { key: "a" value { channels: -1 } }', None, None),
    ('record { key: "a" value { scale_w: 1 scale_d: x } }', None, None),
    ('record { key: "a" value { bogus: 1 } }', None, None),
    ('record { key: "a" ', None, None),
])
def test_malformed_records(tmp_path, text, expect, layer):
    path = write(tmp_path, "r.txt", text)
    with pytest.raises(RecordError) as ei:
        read_record(path)
    assert ei.value.file == path and ei.value.layer == layer
    if expect:
        assert str(ei.value).endswith(expect)
    else:
        assert ei.value.line == 1 and "cannot parse record file" in str(ei.value)


def test_missing_record_file(tmp_path):
    with pytest.raises(RecordError, match="record file not found"):
        read_record(str(tmp_path / "none.txt"))


@pytest.mark.parametrize("rec,expect", [
    (LayerRecord(scale_d=1.0, offset_d=2 ** 31), "offset_d 2147483648 is out of range"),
    (LayerRecord(scale_d=1.0, offset_d=0, shift_bit=[-1]), "shift_bit -1 is out of range"),
    (LayerRecord(scale_d=1.0, offset_d=0, channels=2.5), "channels must be an integer, got 2.5"),
])
def test_write_refuses_values_the_format_cannot_hold(tmp_path, rec, expect):
    path = str(tmp_path / "r.txt")
    with pytest.raises(RecordError) as ei:
        write_record(path, {"L": rec})
    assert ei.value.layer == "L" and expect in str(ei.value)
    assert not os.path.exists(path)


def test_parse_record_text_empty():
    assert parse_record_text("") == {}


def test_a_record_changed_on_disk_after_our_write_is_read_again(tmp_path):
    """The process keeps what it last wrote to skip re-parsing it; an edit by anyone else (a
    different size, mtime or inode) must be seen."""
    path = str(tmp_path / "r.txt")
    write_record(path, {"conv1": LayerRecord(scale_d=0.5, offset_d=-3, scale_w=[0.25], offset_w=[0])})
    first = read_record(path)
    assert first["conv1"].scale_w == [0.25]
    first["conv1"].scale_w.append(9.0)                    # the caller's copy, not the cache
    assert read_record(path)["conv1"].scale_w == [0.25]
    with open(path) as f:
        text = f.read()
    with open(path + ".tmp", "w") as f:                   # replaced by another program
        f.write(text.replace("0.25", "0.125"))
    os.replace(path + ".tmp", path)
    assert read_record(path)["conv1"].scale_w == [0.125]
