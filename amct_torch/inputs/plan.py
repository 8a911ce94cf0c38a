"""One job's calibration data, planned once: the batches that calibrate, the ones held out for
the per-layer report and the improvements' guard, and every check that must pass first.

Why: the job asks one object for its batches instead of calling a dozen functions of inputs/
and caffe/ in the right order. Before the first forward the plan checks the data settings,
the activation memory (at the shape after preprocessing, then the first batch's real shape)
and the held-out images, so that nothing about the data fails a finished calibration; the
checks know the net, and the plan names its model file in their errors.
"""
from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterable, Iterator
from typing import Any, Optional

from amct_torch.caffe.memory import check_activation_memory, checked_first_batch
from amct_torch.errors import AmctError
from amct_torch.inputs.batching import HELD_ROWS, Keep, NetData, default_batch_size, held_out_batches, report_use
from amct_torch.inputs.data import Preprocess, calibration_batches, count_samples
from amct_torch.inputs.data_checks import check_data_settings, check_held_out_images, preprocessed_sample_shape

__all__ = ["BatchPlan", "plan_batches"]


class BatchPlan:
    """The batches of one job (made by ``plan_batches``): ``calibration_batches`` once, then
    ``calibrated`` with what the calibration loop left; ``guard_batches`` and
    ``report_batches`` read the held-out batches after them. ``batch_size`` and ``count`` (the
    samples the data holds; None when unknown) are known once the calibration batches are;
    ``cache`` (the calibration batches kept for later steps: all of them with ``keep_all``) and
    ``samples`` (the samples calibrated on) once calibrated."""

    def __init__(self, model: Any, data: Any, model_file: str, device: Any, batch_size: Optional[int],
                 preprocess: Optional[Preprocess], report_batches: int, report_data: Any, guard: bool,
                 keep_all: bool) -> None:
        self.model, self.data, self.model_file, self.device = model, data, model_file, device
        self.preprocess, self.report_data, self.guard = preprocess, report_data, guard
        self.report_count = report_batches
        # all calibration batches only for what reads them again (bias correction, ONNX speed mode);
        # otherwise the report's fallback at most: 256 images at 224x224 are 154 MB
        self.keep = Keep(None if keep_all else report_batches)
        self.net_data = NetData(model, model_file, batch_size) if data is None else None
        self.batch_size = self.net_data.batch_size if self.net_data is not None else batch_size
        self.count: Optional[int] = None
        self.batch_num = 0
        self.held_out = 0  # batches after the calibration ones read later (checked up front)
        self.rest: Iterator[Any] = iter(())
        self.cache: list = []
        self.samples = 0

    def calibration_batches(self, batch_num: int) -> Iterable[Any]:
        """The batches to calibrate on (the first ``batch_num`` are kept and counted), once the
        data settings, the activation memory and the held-out images passed their checks; the
        first batch's real shape is checked for memory before it is passed on."""
        self.batch_num = batch_num
        if self.net_data is not None:  # the net's own TEST data layers
            assert self.batch_size is not None  # the layers' batch size
            with self._naming_model():
                check_activation_memory(self.model, self.batch_size, None, self.device)
            return self.keep(self._checked(self.net_data.batches()), batch_num)
        inputs = self.model.caffe_inputs
        self.count = count_samples(self.data, inputs)
        if self.batch_size is None:
            self.batch_size = default_batch_size(self.count, batch_num)
        bs = self.batch_size
        with self._naming_model():
            check_data_settings(self.data, inputs, self.preprocess, None)
            check_activation_memory(self.model, bs or 1, None, self.device,
                                    sample_shape=preprocessed_sample_shape(self.data, inputs, self.preprocess))
        # the rows read after calibration (the report's batches, the improvements' guard rows):
        # decoded now, so that a bad image among them cannot fail a finished job
        self.held_out = self.report_count if self.report_data is None else 0
        if self.guard and bs:
            self.held_out = max(self.held_out, -(-HELD_ROWS // bs))
        if self.held_out and bs:
            check_held_out_images(self.data, inputs, self.preprocess, batch_num * bs, self.held_out * bs)
        return self.keep(self._checked(calibration_batches(self.data, inputs, bs, self.preprocess)), batch_num)

    def _checked(self, batches: Iterable[Any]) -> Iterator[Any]:
        """``batches`` unchanged, the first one's activation memory checked at its real shape
        before it is passed on, so before any forward."""
        return checked_first_batch(batches, self.model, self.model_file, self.device)

    @contextlib.contextmanager
    def _naming_model(self) -> Iterator[None]:
        """The plan's checks know the net, not its file: an error of theirs names the model file."""
        try:
            yield
        except AmctError as err:
            if err.file is None:
                err.with_file(self.model_file)
            raise

    def calibrated(self, rest: Iterator[Any]) -> None:
        """Keep ``rest``, the batches after the calibration ones (the calibration loop's answer),
        and log how many samples calibrated."""
        self.rest, self.cache, self.samples = rest, self.keep.cache, self.keep.samples
        report_use(self.keep, self.count, self.batch_num, self.batch_size, self.held_out)

    def guard_batches(self) -> list:
        """The held-out batches the improvements' guard judges on (at least the report's, and
        ``HELD_ROWS`` samples where the data has them); the report reads the same ones first."""
        held, self.rest = held_out_batches(self.rest, self.report_count)
        return held

    def report_batches(self) -> tuple[list, bool]:
        """The per-layer report's batches and whether they are held out: its own data when
        given, else the held-out batches after the calibration ones, else (the data has no
        more) the first calibration batches."""
        if self.report_data is not None:
            held = list(calibration_batches(self.report_data, self.model.caffe_inputs, self.batch_size,
                                            self.preprocess))
        else:
            held = list(itertools.islice(self.rest, self.report_count))
        held_out = bool(held) or self.report_data is not None
        return (held or self.cache[:self.report_count]), held_out

    def close(self) -> None:
        """Release the net's data layers (their databases and decoding threads)."""
        if self.net_data is not None:
            self.net_data.close()


def plan_batches(model: Any, data: Any, *, model_file: str, device: Any, batch_size: Optional[int] = None,
                 preprocess: Optional[Preprocess] = None, report_batches: int = 0, report_data: Any = None,
                 guard: bool = False, keep_all: bool = False) -> BatchPlan:
    """The batch plan of a job on the loaded graph ``model`` (a ``CaffeGraphModule``).

    ``data``: the user's calibration data (see ``calibration_batches``), or None for the net's
    own TEST-phase data layers (opened now: a net without them is a ``DataError`` naming
    ``model_file``). ``batch_size``: None spreads the samples over the batches (at most
    ``MAX_DEFAULT_BATCH``). ``report_batches``: the per-layer report's batches (0: no report),
    read from ``report_data`` when given, else after the calibration batches. ``guard``: the
    improvements judge on held-out rows. ``keep_all``: every calibration batch is read again
    later (bias correction, the ONNX speed mode), else at most the report's are kept."""
    return BatchPlan(model, data, model_file, device, batch_size, preprocess, report_batches, report_data,
                     guard, keep_all)
