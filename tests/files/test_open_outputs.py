"""``files.open_outputs``: a command's outputs checked against its inputs before any work, then
(on the writing process) their transaction begun; a process that writes nothing checks the
same and leaves no trace."""
from __future__ import annotations

import os

import pytest

from amct_torch.errors import AmctError
from amct_torch.files import open_outputs


@pytest.mark.parametrize("writer", [True, False])
def test_an_output_that_is_an_input_is_refused_before_anything_is_made(tmp_path, writer):
    model = tmp_path / "out" / "m_record.txt"
    model.parent.mkdir()
    model.write_text("the user's file")
    finals = [str(model), str(tmp_path / "out" / "m_quant.json")]
    with pytest.raises(AmctError, match="would overwrite the input") as err:
        open_outputs(finals, [str(model)], name="m", writer=writer)
    assert err.value.file == str(model)
    assert sorted(os.listdir(tmp_path / "out")) == ["m_record.txt"] and model.read_text() == "the user's file"


def test_the_writer_gets_a_begun_transaction_and_the_others_nothing(tmp_path):
    finals = [str(tmp_path / "new" / "m_record.txt")]
    assert open_outputs(finals, [], name="m", writer=False) is None
    assert not (tmp_path / "new").exists()
    tx = open_outputs(finals, [], name="m", owns_prefix=str(tmp_path / "new" / "m"))
    try:
        assert tx is not None and tx.staging == str(tmp_path / "new" / ".m.amct-partial")
        assert os.path.isdir(tx.staging)
    finally:
        assert tx is not None
        tx.abort()
    assert not (tmp_path / "new").exists()  # the folder it made goes with the aborted run
