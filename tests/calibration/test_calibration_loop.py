"""The one calibration loop (``loop.run_calibration``) and the session's explicit way to stay
open (``finish_when_done`` / ``kept_open``), on the bundled example model.

The reference is the AMCT user loop: the model ``quantize_model`` returned, run by hand on
the same batches, finishing by itself after ``batch_num`` forwards.
"""
from __future__ import annotations

import os

import pytest
import torch

from amct_torch.errors import DataError

BATCH_SIZE = 30


def example_batches(count: int) -> list[torch.Tensor]:
    from amct_torch.workflow.examples import example_data
    x, _ = example_data("calib")
    assert len(x) >= count * BATCH_SIZE
    return [torch.from_numpy(x[i * BATCH_SIZE:(i + 1) * BATCH_SIZE]) for i in range(count)]


def setup(tmp: str, tag: str, batch_num: int):
    """init + quantize_model of the example, calibrating on ``batch_num`` batches."""
    from amct_torch.api import init, quantize_model
    from amct_torch.config import create_quant_config
    from amct_torch.workflow.examples import example_model
    model, weights = example_model()
    cfg = os.path.join(tmp, f"{tag}.json")
    create_quant_config(cfg, model, weights, batch_num=batch_num)
    graph = init(cfg, model, weights, os.path.join(tmp, f"{tag}_record.txt"))
    m = quantize_model(graph, os.path.join(tmp, f"{tag}.prototxt"), os.path.join(tmp, f"{tag}.caffemodel"))
    return graph, m


def user_loop_factors(tmp: str, batch_num: int) -> dict:
    graph, m = setup(tmp, f"ref{batch_num}", batch_num)
    with torch.no_grad():
        for b in example_batches(batch_num):
            m(b)
    assert graph.session.done
    return graph.session.factors


def count_forwards(m: torch.nn.Module) -> list:
    seen: list = []
    m.register_forward_hook(lambda _m, _a, _o: seen.append(1))
    return seen


def test_loop_matches_the_user_loop_and_returns_the_rest(tmp_path):
    from amct_torch.calibration.loop import run_calibration
    graph, m = setup(str(tmp_path), "loop", 4)
    data = example_batches(6)
    rest = run_calibration(m, graph.session, iter(data), torch.device("cpu"), quiet=True)
    assert graph.session.done and graph.session.batches_seen == 4
    assert graph.session.factors == user_loop_factors(str(tmp_path), 4)
    held_out = list(rest)
    assert len(held_out) == 2 and all(torch.equal(a, b) for a, b in zip(held_out, data[4:]))
    assert graph.session.finish_when_done  # the loop gave the session back as it found it


def test_kept_open_session_counts_every_forward_until_finish(tmp_path):
    graph, m = setup(str(tmp_path), "open", 4)
    session = graph.session
    with session.kept_open(), torch.no_grad():
        assert not session.finish_when_done
        for b in example_batches(6):
            m(b)
        assert not session.done and session.batches_seen == 6
    assert session.finish_when_done
    session.finish()
    # six batches calibrated: what a session asking for six gives, not what four give
    six, four = user_loop_factors(str(tmp_path), 6), user_loop_factors(str(tmp_path), 4)
    assert session.factors == six and six != four


def test_session_set_open_waits_for_finish(tmp_path):
    graph, m = setup(str(tmp_path), "flag", 2)
    graph.session.finish_when_done = False
    with torch.no_grad():
        for b in example_batches(3):
            m(b)
    assert not graph.session.done and graph.session.batches_seen == 3
    assert graph.session.finish() == user_loop_factors(str(tmp_path), 3)


def test_short_data_is_a_data_error_and_the_session_stays_usable(tmp_path):
    from amct_torch.calibration.loop import run_calibration
    graph, m = setup(str(tmp_path), "short", 6)
    with pytest.raises(DataError, match=r"only 4 batch\(es\); batch_num is 6"):
        run_calibration(m, graph.session, example_batches(4), torch.device("cpu"), quiet=True)
    assert not graph.session.done and graph.session.finish_when_done
    with torch.no_grad():  # the user can still finish it by hand: two more batches
        for b in example_batches(6)[4:]:
            m(b)
    assert graph.session.done and graph.session.factors == user_loop_factors(str(tmp_path), 6)


def test_checkpoint_resumes_where_the_data_ran_out(tmp_path):
    from amct_torch.calibration.loop import run_calibration
    tmp = str(tmp_path)
    ckpt = os.path.join(tmp, "run.ckpt")
    graph, m = setup(tmp, "first", 6)
    with pytest.raises(DataError):
        run_calibration(m, graph.session, example_batches(3), torch.device("cpu"), quiet=True, checkpoint=ckpt)
    assert int(torch.load(ckpt, weights_only=True)["batches_seen"]) == 3
    graph, m = setup(tmp, "second", 6)
    forwards = count_forwards(m)
    run_calibration(m, graph.session, example_batches(6), torch.device("cpu"), quiet=True, checkpoint=ckpt)
    assert len(forwards) == 3            # the three saved batches were not run again
    assert not os.path.exists(ckpt)      # removed once the factors were computed
    assert graph.session.factors == user_loop_factors(tmp, 6)
