"""``amct-torch evaluate``: run any Caffe model amct_torch loads (float, fake-quant or the
deploy model with its integer semantics) on data and compare each output with a reference
model (normally the float one): SQNR and cosine similarity per output blob.

Why here and not in report.py: the per-layer report compares two torch graphs built in one
calibration; this compares two models from files, as a user would check the exact files they
ship, and works for the deploy model, which has no float weights to report per layer.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from amct_torch.errors import AmctError, DataError, ModelError, excerpt

#: samples per batch by default (a batch of calibrate's size on a typical image net)
DEFAULT_BATCH = 8

if TYPE_CHECKING:  # torch loads when a model runs: the command's --help reads DEFAULT_BATCH from here
    import torch


@dataclass
class OutputStats:
    """Per output blob: its shape (first batch), and against the reference (None without one
    or when the shapes differ, e.g. a DetectionOutput): SQNR in dB and cosine similarity."""
    name: str
    shape: tuple
    sqnr_db: Optional[float] = None
    cosine: Optional[float] = None
    max_abs_diff: Optional[float] = None
    note: str = ""


class Evaluation(list):
    """``evaluate``'s result: the ``OutputStats`` rows (a list), shown by Jupyter as a table,
    with how many samples and batches the figures cover (the rows' shape is one batch's;
    ``coverage()`` says it in a line)."""

    def __init__(self, rows: Any = (), samples: int = 0, batches: int = 0) -> None:
        super().__init__(rows)
        self.samples = samples
        self.batches = batches

    def coverage(self) -> str:
        """What the figures cover, as the command prints it under the table."""
        return f"over {self.samples} sample(s) in {self.batches} batch(es)"

    def _repr_html_(self) -> str:
        from amct_torch.quality.html_report import evaluation_html
        return evaluation_html(self)


class _Sums:
    """Running sums over batches, so that any number of batches takes constant memory."""

    def __init__(self) -> None:
        self.sig = self.err = self.dot = self.nx = self.ny = 0.0
        self.maxdiff = 0.0

    def add(self, out: torch.Tensor, ref: torch.Tensor) -> None:
        import torch
        o, r = out.double().flatten(), ref.double().flatten()
        d = o - r
        big = d.abs().max() if d.numel() else d.new_zeros(())
        # one read-back per batch and output (on a GPU each read stalls the stream)
        sig, err, dot, nx, maxdiff = torch.stack([(r * r).sum(), (d * d).sum(), (o * r).sum(),
                                                  (o * o).sum(), big]).tolist()
        self.sig += sig
        self.err += err
        self.dot += dot
        self.nx += nx
        self.ny += sig
        self.maxdiff = max(self.maxdiff, maxdiff)

    def sqnr(self) -> float:
        if self.err == 0:
            return math.inf
        return 10 * math.log10(self.sig / self.err) if self.sig > 0 else -math.inf

    def cosine(self) -> float:
        den = math.sqrt(self.nx * self.ny)
        return self.dot / den if den > 0 else (1.0 if self.nx == self.ny else 0.0)


def data_dependent_outputs(gm: Any) -> set[str]:
    """The output blobs whose shape may depend on the data's values: those downstream of a
    layer marked ``data_dependent`` (DetectionOutput, Proposal: how many boxes survive NMS).
    Only these may differ in shape from the reference's."""
    dep: dict[Any, bool] = {}
    outputs: dict[str, Any] = {}
    for node in gm.graph.nodes:
        own = node.op == "call_module" and bool(getattr(gm.get_submodule(node.target), "data_dependent", False))
        dep[node] = own or any(dep.get(a, False) for a in node.all_input_nodes)
        if node.op == "output" and node.args and isinstance(node.args[0], dict):
            outputs = node.args[0]
    return {k for k, n in outputs.items() if dep.get(n, False)}


def _check_reference_inputs(model: Any, ref: Any, model_file: str, reference: Sequence[str]) -> None:
    """Refuse, before any forward, a reference whose declared inputs differ from the model's
    (names, count or shape): the two cannot be fed the same batches."""
    mine = [(n, list(s) if s else None) for n, s in model.caffe_inputs]
    theirs = [(n, list(s) if s else None) for n, s in ref.caffe_inputs]
    if len(mine) != len(theirs):
        raise ModelError(f"the reference takes {len(theirs)} input(s), the model {len(mine)}: they "
                         "cannot run on the same data", file=reference[0])
    for (n, s), (rn, rs) in zip(mine, theirs):
        if s and rs and s[1:] != rs[1:]:
            raise ModelError(f"the reference's input '{rn}' has shape {rs[1:]} per sample but the "
                             f"model's '{n}' has {s[1:]}: they cannot run on the same data",
                             file=reference[0])


def _forward(model: Any, xs: tuple, model_file: str) -> dict:
    """One forward; a shape the net cannot take is a ``ModelError`` naming the model file."""
    try:
        return model(*xs)
    except RuntimeError as err:
        shapes = ", ".join(str(list(x.shape)) for x in xs)
        raise ModelError(f"the model cannot run on a batch of shape {shapes}: "
                         f"{excerpt(str(err).splitlines()[0] if str(err) else type(err).__name__)}",
                         file=model_file) from None


def evaluate(model_file: str, weights_file: str, data: Any,
             reference: Optional[Sequence[str]] = None, *, batch_size: Optional[int] = DEFAULT_BATCH,
             max_batches: Optional[int] = None, preprocess: Any = None,
             device: Optional[str] = None, quiet: bool = True) -> Evaluation:
    """Run ``model_file``/``weights_file`` on ``data`` (what ``calibrate`` accepts: a folder of
    images or arrays, a .npy/.npz file, an array; images preprocessed by ``preprocess`` as
    calibrate does) in batches of ``batch_size`` and, with ``reference`` = (prototxt,
    caffemodel), compare every output blob the two models share. ``device``: None or "auto"
    (CUDA when present), "cpu", "cuda[:N]". Every problem with the arguments is an
    ``AmctError`` raised before the first forward; ``quiet`` False shows a progress bar."""
    import torch

    from amct_torch.caffe.graph import load_caffe
    from amct_torch.caffe.memory import check_activation_memory, checked_first_batch
    from amct_torch.calibration.loop import resolve_device
    from amct_torch.inputs.data import calibration_batches, count_samples
    from amct_torch.inputs.data_checks import check_data_settings, preprocessed_sample_shape

    dev = resolve_device(device)
    if reference is not None and (isinstance(reference, (str, bytes)) or len(reference) != 2):
        raise AmctError("reference must be (prototxt, caffemodel)")
    model = load_caffe(model_file, weights_file).to(dev)
    ref = load_caffe(*reference).to(dev) if reference else None
    if ref is not None and reference:
        _check_reference_inputs(model, ref, model_file, reference)
    decl = model.caffe_inputs
    check_data_settings(data, decl, preprocess, model_file)
    count = count_samples(data, decl)
    bs = batch_size or 1
    check_activation_memory(model, bs, model_file, dev,
                            sample_shape=preprocessed_sample_shape(data, decl, preprocess))
    batches = checked_first_batch(calibration_batches(data, decl, batch_size, preprocess), model, model_file, dev)
    may_differ = data_dependent_outputs(model) | (data_dependent_outputs(ref) if ref is not None else set())
    sums: dict[str, _Sums] = {}
    stats: dict[str, OutputStats] = {}
    n = rows = 0
    total = -(-count // bs) if count else None
    if max_batches is not None:
        total = min(total, max_batches) if total is not None else max_batches
    bar = _bar(total, quiet)
    try:
        with torch.no_grad():
            for batch in batches:
                if max_batches is not None and n >= max_batches:
                    break
                xs = batch if isinstance(batch, tuple) else (batch,)
                xs = tuple(x.to(dev) for x in xs)
                out = _forward(model, xs, model_file)
                want = _forward(ref, xs, reference[0]) if ref is not None and reference else {}
                _accumulate(out, want, stats, sums, may_differ, model_file, reference)
                n += 1
                rows += int(xs[0].shape[0]) if xs[0].dim() else 1
                if bar is not None:
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    if n == 0:
        raise DataError("no data to evaluate on", file=str(data) if isinstance(data, str) else None)
    for k, s in sums.items():
        if not stats[k].note:
            stats[k].sqnr_db, stats[k].cosine, stats[k].max_abs_diff = s.sqnr(), s.cosine(), s.maxdiff
    return Evaluation(stats.values(), samples=rows, batches=n)


def _bar(total: Optional[int], quiet: bool) -> Any:
    """A tqdm bar over the batches on stderr (rate and ETA), or None when quiet or not a terminal."""
    from amct_torch.runtime.progress import progress_enabled
    if not progress_enabled(quiet):
        return None
    import sys

    from tqdm import tqdm
    return tqdm(total=total, desc="evaluating", unit="batch", file=sys.stderr)


def _accumulate(out: dict, want: dict, stats: dict, sums: dict, may_differ: set, model_file: str,
                reference: Optional[Sequence[str]]) -> None:
    """One batch's outputs into the running sums (and the per-output notes)."""
    for k, v in out.items():
        st = stats.setdefault(k, OutputStats(k, tuple(v.shape)))
        if not reference:
            continue
        if k not in want:
            st.note = "not an output of the reference"
        elif tuple(want[k].shape) != tuple(v.shape):
            if k not in may_differ:  # the two models do not compute the same output
                raise ModelError(f"output '{k}' has shape {list(v.shape)} but the reference "
                                 f"{reference[0]} gives {list(want[k].shape)} for the same "
                                 "input: the models do not match", file=model_file)
            st.note = f"shape {list(v.shape)} vs reference {list(want[k].shape)}"
            sums.pop(k, None)
        elif not st.note:
            sums.setdefault(k, _Sums()).add(v, want[k])


def format_stats(stats: Sequence[OutputStats]) -> str:
    """The table the CLI prints: one line per output blob."""
    lines = [f"{'output':<28} {'shape':<20} {'SQNR dB':>9} {'cosine':>10} {'max |diff|':>11}"]
    for s in stats:
        if s.sqnr_db is None:
            lines.append(f"{s.name:<28} {str(list(s.shape)):<20} {'-':>9} {'-':>10} {'-':>11}  {s.note}")
        else:
            lines.append(f"{s.name:<28} {str(list(s.shape)):<20} {s.sqnr_db:>9.2f} {s.cosine:>10.6f} "
                         f"{s.max_abs_diff:>11.4g}")
    return "\n".join(lines)
