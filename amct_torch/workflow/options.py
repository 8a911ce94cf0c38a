"""The settings of one ``quantize`` job, checked before any work.

Why an object: the one-call job has some twenty settings; carrying them as one validated
value keeps the steps (plan, calibrate, write) short and lets each read only what it needs.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Union

from amct_torch.errors import AmctError, CalibrationError, ConfigError, ModelError
from amct_torch.inputs.data import Preprocess
from amct_torch.inputs.limits import check_batch_num, check_checkpoint_path, check_regular_file
from amct_torch.output_names import ONNX_ACTIVATIONS, ONNX_TARGETS, PREFIX_SUFFIXES, SAVE_TYPES, improvement_list
from amct_torch.transaction import check_output_name


@dataclass
class QuantizeOptions:
    """Everything ``quantize`` takes (its docstring says what each does)."""

    model_file: str
    weights_file: str
    calibration_data: Any
    config: Optional[str] = None
    output: str = "amct_output/model"
    batch_num: Optional[int] = None
    batch_size: Optional[int] = None
    device: Optional[str] = None
    preprocess: Optional[Preprocess] = None
    skip_layers: Optional[Sequence[str]] = None
    activation_offset: bool = True
    save_type: Optional[str] = "Both"
    onnx: Union[bool, str] = False
    onnx_speed: bool = False
    onnx_outputs: Optional[Sequence[str]] = None
    report: bool = True
    report_data: Any = None
    report_batches: int = 2
    ifmr_mode: str = "streaming"
    quiet: bool = False
    improve: Union[None, str, Sequence[str]] = None
    distributed: bool = False
    checkpoint: Optional[str] = None
    onnx_target: str = "onnxruntime"
    allow_unknown_fields: bool = False

    def validate(self) -> "QuantizeOptions":
        """Refuse bad settings (before any file is read or written); returns self."""
        for p, what in ((self.model_file, "model file"), (self.weights_file, "weights file")):
            if not isinstance(p, (str, os.PathLike)) or isinstance(p, bytes):
                raise ModelError(f"{what} must be a path (str or os.PathLike), got {type(p).__name__}")
            check_regular_file(os.fspath(p), what, ModelError)
        if self.save_type is not None and self.save_type not in SAVE_TYPES:
            raise AmctError(f"save_type must be one of {', '.join(SAVE_TYPES)} or None, got {self.save_type!r}")
        if self.onnx not in (False, None, True) + ONNX_ACTIVATIONS:
            raise AmctError(f"onnx must be True, False, 'int8' or 'uint8', got {self.onnx!r}")
        if self.onnx_target not in ONNX_TARGETS:
            raise AmctError(f"onnx_target must be one of {', '.join(ONNX_TARGETS)}, got {self.onnx_target!r}")
        if self.onnx:  # a target that cannot express the settings: refused before any work
            from amct_torch.export.onnx.targets import check_options
            check_options(self.onnx_target, self.activation_offset, self.config, self.onnx_speed)
        if self.batch_num is not None:  # bounded: an absurd count overflowed the config's field
            self.batch_num = check_batch_num(self.batch_num, file=self.data_path, error=ConfigError)
        if isinstance(self.report_batches, bool) or not isinstance(self.report_batches, int) or self.report_batches < 0:
            raise AmctError(f"report_batches must be an integer >= 0, got {self.report_batches!r}")
        if self.checkpoint is not None:  # a FIFO blocks, a missing folder failed after batch 1
            check_checkpoint_path(os.fspath(self.checkpoint), error=CalibrationError)
        try:  # a list, a comma-separated string or "all", held as the tuple in applying order
            self.improve = improvement_list(self.improve)
        except ValueError as err:
            raise AmctError(str(err)) from None
        self.output = check_output_name(self.output, "output", PREFIX_SUFFIXES)
        return self

    @property
    def data_path(self) -> Optional[str]:
        """The calibration data as a path, when it is one."""
        d = self.calibration_data
        return os.fspath(d) if isinstance(d, (str, os.PathLike)) else None

    @property
    def inputs(self) -> list:
        """Every file the job reads (no output may be one of them)."""
        return [self.model_file, self.weights_file, self.config, self.checkpoint] + \
            ([self.data_path] if self.data_path else [])

    @property
    def onnx_activations(self) -> str:
        """The ONNX model's activation type (uint8 unless asked: same values, faster in ORT)."""
        return self.onnx if isinstance(self.onnx, str) else "uint8"
