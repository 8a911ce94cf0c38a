"""Every exported function and class refuses a wrong argument's type or value with an
``AmctError`` subclass naming the argument, before any work and without writing anything; and
takes ``os.PathLike`` wherever it takes a path."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

import amct_torch
from amct_torch.errors import AmctError
from helpers.api_misuse import DATA, MODEL, WEIGHTS, call, rows

CALLABLES = [n for n in amct_torch.__all__
             if callable(getattr(amct_torch, n)) and not isinstance(getattr(amct_torch, n), type)]


def test_the_table_covers_every_exported_function():
    covered = {r[0] for r in rows("/nonexistent")}
    assert set(CALLABLES) <= covered, set(CALLABLES) - covered
    assert "Preprocess" in covered


@pytest.mark.parametrize("row", rows("WORK"), ids=lambda r: f"{r[0]}-{r[3]}")
def test_a_wrong_argument_is_one_clear_error_naming_it(tmp_path, row):
    name, args, kwargs, arg = row
    work = str(tmp_path)
    args = tuple(a.replace("WORK", work) if isinstance(a, str) else a for a in args)
    kwargs = {k: v.replace("WORK", work) if isinstance(v, str) else v for k, v in kwargs.items()}
    with pytest.raises(AmctError) as err:
        call(name, args, kwargs)
    msg = str(err.value)
    assert arg in msg and "\n" not in msg, msg
    assert os.listdir(tmp_path) == []


def test_paths_may_be_pathlike(tmp_path):
    out = tmp_path / "o" / "m"
    res = amct_torch.quantize(Path(MODEL), Path(WEIGHTS), Path(DATA), output=out, device="cpu",
                              quiet=True, report=False, save_type="Fakequant", batch_num=1)
    assert res.files["record"] == str(out) + "_record.txt" and os.path.isfile(res.files["record"])
    records = amct_torch.read_record(Path(res.files["record"]))
    assert set(records) == set(res.records)
    written = amct_torch.convert_model(Path(MODEL), Path(WEIGHTS), Path(res.files["record"]), tmp_path / "c" / "m")
    assert all(isinstance(p, str) and os.path.isfile(p) for p in written)
    gm = amct_torch.load_caffe(Path(MODEL), Path(WEIGHTS))
    assert gm.caffe_inputs[0][0] == "data"
