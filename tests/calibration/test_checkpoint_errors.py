"""Bad checkpoints are refused with CalibrationError naming the file, and loading never
unpickles objects (a file carrying a pickled object with a side effect does not run it)."""
from __future__ import annotations

import pytest
import torch

from amct_torch.errors import CalibrationError
from helpers.checkpoint_job import batches, setup


class _Boom:
    """Unpickling this would create a marker file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _session(tmp, mode="exact"):
    graph, m = setup(str(tmp), mode, "t")
    return graph.session, m


def test_roundtrip_restores_state(tmp_path, device):
    """Saved after 2 batches, loaded into a fresh session on the same device: identical states
    (on that device), and one more batch keeps both sessions identical."""
    from amct_torch.calibration.checkpoint import load_checkpoint, save_checkpoint
    (tmp_path / "a").mkdir()
    s1, m1 = _session(tmp_path / "a", "streaming")
    m1.to(device)
    it = batches()
    with torch.no_grad():
        m1(next(it).to(device)); m1(next(it).to(device))
    path = str(tmp_path / "c.ckpt")
    save_checkpoint(s1, path)
    (tmp_path / "b").mkdir()
    s2, m2 = _session(tmp_path / "b", "streaming")
    m2.to(device)
    assert load_checkpoint(s2, path) == 2
    third = next(it).to(device)
    with torch.no_grad():
        m1(third); m2(third)
    for o1, o2 in zip(s1.observers, s2.observers):
        a, b = o1.state_dict(), o2.state_dict()
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
        assert all(v.device.type == torch.device(device).type for k, v in b.items() if k in ("top", "bottom", "counts"))
    assert [g.shape for g in s1.groups] == [g.shape for g in s2.groups]


def test_corrupt_file(tmp_path):
    from amct_torch.calibration.checkpoint import load_checkpoint
    s, _ = _session(tmp_path)
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(b"not a checkpoint at all")
    with pytest.raises(CalibrationError, match="bad.ckpt"):
        load_checkpoint(s, str(bad))


def test_pickled_object_is_not_executed(tmp_path):
    from amct_torch.calibration.checkpoint import load_checkpoint
    s, _ = _session(tmp_path)
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.ckpt"
    torch.save({"meta": _Boom(str(marker))}, str(evil))
    with pytest.raises(CalibrationError, match="evil.ckpt"):
        load_checkpoint(s, str(evil))
    assert not marker.exists()


def test_other_config_refused(tmp_path):
    from amct_torch.calibration.checkpoint import load_checkpoint, save_checkpoint
    (tmp_path / "a").mkdir(); (tmp_path / "b").mkdir()
    s1, m1 = _session(tmp_path / "a", "exact")
    with torch.no_grad():
        m1(next(batches()))
    path = str(tmp_path / "x.ckpt")
    save_checkpoint(s1, path)
    s2, _ = _session(tmp_path / "b", "hfmg")
    with pytest.raises(CalibrationError, match="another model or quant config"):
        load_checkpoint(s2, path)


def test_missing_file(tmp_path):
    from amct_torch.calibration.checkpoint import load_checkpoint
    s, _ = _session(tmp_path)
    with pytest.raises(CalibrationError, match="not found"):
        load_checkpoint(s, str(tmp_path / "nope.ckpt"))
