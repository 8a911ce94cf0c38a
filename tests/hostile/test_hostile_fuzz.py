"""Fuzzing the readers of user files with hypothesis: whatever the bytes, the prototxt,
caffemodel, quant.cfg, JSON config and record readers and the .npy/.npz/image loaders either
return or raise the project's error for that kind of file, naming it — never another
exception. Inputs are random token soups and mutations (cuts, flips, insertions) of real
files."""
from __future__ import annotations

import io
import os

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import helpers.hostile_cases as hc
from amct_torch.errors import ConfigError, DataError, ModelError, RecordError
from amct_torch.workflow.examples import EXAMPLE_DIR

FUZZ = settings(max_examples=120, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

MODEL_TEXT = hc.model_text()
WEIGHTS = hc.weights_bytes()
RECORD_TEXT = hc.record_texts()["scale_d_1e-30"].replace("1e-30", "0.01")
CFG_TEXT = hc.quant_cfg_texts()["search_step_1e-9"].replace("1e-9", "0.01")
TOKENS = ["layer", "{", "}", ":", '"', "'", "\\", "name", "type", "dim", "shape", "input_param",
          "record", "key", "value", "scale_d", "1e309", "-1", "nan", "\n", " ", "#", "<", ">",
          "[", "]", ",", "9" * 30, "\x00", "é", "common_config", "ifmr_quantize", "search_step"]


def _mutations(base: bytes):
    """Strategy of mutated copies of ``base``: a cut, flipped bytes, an inserted chunk."""
    n = len(base)
    cut = st.integers(0, n).map(lambda k: base[:k])
    flip = st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, 255)), min_size=1, max_size=8).map(
        lambda edits: _apply(base, edits))
    insert = st.tuples(st.integers(0, n), st.binary(min_size=1, max_size=64)).map(
        lambda t: base[:t[0]] + t[1] + base[t[0]:])
    return st.one_of(cut, flip, insert)


def _apply(base: bytes, edits) -> bytes:
    b = bytearray(base)
    for i, v in edits:
        b[i] = v
    return bytes(b)


def _soup():
    return st.lists(st.sampled_from(TOKENS), max_size=80).map("".join)


def _text_mutations(base: str):
    """Mutated copies of ``base`` as text (its bytes mutated, read back as latin-1)."""
    return _mutations(base.encode()).map(lambda b: b.decode("latin-1"))


def _texts(base: str):
    """Token soup, or mutated copies of ``base``."""
    return st.one_of(_soup(), _text_mutations(base))


def _write(tmp_path, name: str, data) -> str:
    p = os.path.join(str(tmp_path), name)
    with open(p, "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass"))
    return p


def _only(error, path, call):
    try:
        call()
    except error as err:
        assert path in str(err), str(err)[:300]


LENET = os.path.join(EXAMPLE_DIR, "lenet_digits.prototxt")


def _lenet_layers():
    """The example LeNet's layer infos, which the config and record readers check against."""
    from amct_torch.config.create import model_layer_infos
    return model_layer_infos(LENET)


@FUZZ
@given(_texts(MODEL_TEXT))
def test_prototxt_reader(tmp_path, text):
    from amct_torch.caffe.netio import read_net
    p = _write(tmp_path, "m.prototxt", text)
    _only(ModelError, p, lambda: read_net(p))


@FUZZ
@given(st.one_of(st.binary(max_size=300), _mutations(WEIGHTS)))
def test_caffemodel_reader(tmp_path, blob):
    from amct_torch.caffe.netio import read_net
    p = _write(tmp_path, "w.caffemodel", blob)
    try:
        read_net(LENET, p)
    except ModelError as err:
        assert p in str(err) or LENET in str(err), str(err)[:300]


@FUZZ
@given(_texts(CFG_TEXT))
def test_quant_cfg_reader(tmp_path, text):
    from amct_torch.config import parse_quant_cfg, resolve_quant_cfg
    layers = _lenet_layers()
    p = _write(tmp_path, "q.cfg", text)
    _only(ConfigError, p, lambda: resolve_quant_cfg(parse_quant_cfg(p), layers, p))


@FUZZ
@given(st.one_of(st.lists(st.sampled_from(['{', '}', '[', ']', '"', ':', ',', '1e999', '-0', 'NaN',
                                            '"batch_num"', '"conv1"', 'true', 'null', '9' * 50]),
                          max_size=60).map("".join),
                 _text_mutations(hc.json_texts()["wrong_type"].replace('"one"', "1"))))
def test_json_config_reader(tmp_path, text):
    from amct_torch.config import read_quant_config_json
    layers = _lenet_layers()
    p = _write(tmp_path, "c.json", text)
    _only(ConfigError, p, lambda: read_quant_config_json(p, layers))


@FUZZ
@given(_texts(RECORD_TEXT))
def test_record_reader(tmp_path, text):
    from amct_torch.record import read_record, validate_record
    layers = _lenet_layers()
    p = _write(tmp_path, "r.txt", text)
    _only(RecordError, p, lambda: validate_record(read_record(p), layers, p))


def _npy(arr) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


NPY = _npy(np.arange(2 * 16 * 16, dtype=np.float32).reshape(2, 1, 16, 16))
NPZ = hc.zipfile_bytes({"inputs.npy": NPY})


@FUZZ
@given(st.sampled_from([".npy", ".npz"]), st.one_of(st.binary(max_size=200), _mutations(NPY), _mutations(NPZ)))
def test_array_loaders(tmp_path, ext, blob):
    from amct_torch.inputs.data import calibration_batches
    p = _write(tmp_path, "d" + ext, blob)
    _only(DataError, p, lambda: list(calibration_batches(p, [("data", [1, 1, 16, 16])], 2)))


PNG = hc._png(16, 16, b"\x00" * (17 * 16))


@FUZZ
@given(st.sampled_from([".png", ".jpg", ".bmp"]), st.one_of(st.binary(max_size=200), _mutations(PNG)))
def test_image_loader(tmp_path, ext, blob):
    from amct_torch.inputs.data import Preprocess, load_image
    p = _write(tmp_path, "i" + ext, blob)
    _only(DataError, p, lambda: load_image(p, Preprocess(), 1, (16, 16)))


_OLD_LITERAL = None


def _reference_join(text: str) -> str:
    """The joining rule written as the regular expression the linear scan replaced (a plain
    reference: it backtracks quadratically on unclosed quotes, so it is fed closed ones)."""
    import re
    global _OLD_LITERAL
    if _OLD_LITERAL is None:
        _OLD_LITERAL = re.compile(r"""#[^\n]*|"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'""", re.S)

    def join(m):
        lit = m.group(0)
        if lit[0] == "#" or "\n" not in lit:
            return lit
        body = lit[1:-1]
        if "\n" in body.strip():
            return lit
        return lit[0] + body.strip() + lit[0] + "\n" * body.count("\n")
    if "\n" not in text or ('"' not in text and "'" not in text):
        return text
    return _OLD_LITERAL.sub(join, text)


_PIECE = st.one_of(
    st.sampled_from(["key", ":", " ", "\n", "{", "}", "1.5", "\t"]),
    st.builds(lambda q, body: q + body + q, st.sampled_from(['"', "'"]),
              st.lists(st.sampled_from(["a", " ", "\n", "\\\"", "\\'", "\\\\", "#", "b\n"]),
                       max_size=6).map("".join)),
    st.builds(lambda c: "#" + c + "\n", st.sampled_from(["", " note", " 'q", ' "q'])))


@settings(max_examples=400, deadline=None, derandomize=True)
@given(st.lists(_PIECE, max_size=25).map("".join))
def test_linear_join_matches_the_regex_rule(text):
    from amct_torch.config.textproto import join_multiline_strings
    assert join_multiline_strings(text) == _reference_join(text)
