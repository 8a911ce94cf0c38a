"""The settings of one ``quantize`` job, each declared once, checked before any work.

Why an object: the one-call job has some twenty settings; carrying them as one validated
value keeps the steps (plan, calibrate, write) short and lets each read only what it needs.
Each field carries its default, its help, its argument check (``amct_torch.arguments``) and,
when it is one, its ``calibrate`` argument (``option``): ``QUANTIZE_ARGS`` (``quantize``'s and
``validate``'s checks) and the command's one-to-one arguments are made from them.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Optional, Union

from amct_torch.arguments import (
    bool_arg,
    check_values,
    either,
    instance,
    names_arg,
    non_negative_int,
    one_of,
    opt,
    path_arg,
    positive_int,
)
from amct_torch.errors import AmctError, ArgumentError, CalibrationError, ConfigError, ModelError
from amct_torch.export.caffe import SAVE_TYPES
from amct_torch.export.formats import prefix_suffixes
from amct_torch.export.onnx import ONNX_ACTIVATIONS
from amct_torch.export.onnx.runtime_targets import ONNX_TARGETS, get_target
from amct_torch.files.output_names import (
    IMPROVEMENTS,
    improvement_list,
)
from amct_torch.files.transaction import check_output_name
from amct_torch.inputs.limits import check_batch_num, check_checkpoint_path, check_regular_file

if TYPE_CHECKING:
    from amct_torch.inputs.data import Preprocess


def option(default: Any, help: str, arg: Any = None, cli: Optional[dict] = None) -> Any:
    """A ``QuantizeOptions`` field declared once: its default (``MISSING``: required), its
    ``help``, ``arg`` (what the value must be: an ``amct_torch.arguments`` check) and ``cli``
    (the ``calibrate`` argument when it maps one to one: ``flags`` and argparse keywords,
    ``type`` by name: "positive", "names", "improvements"; its help the field's unless given)."""
    meta = {"help": help, "arg": arg, "cli": cli}
    return field(metadata=meta) if default is MISSING else field(default=default, metadata=meta)


def _preprocess(value: Any, name: str) -> Any:
    """A ``Preprocess`` (imported when checked: declaring the options needs no torch)."""
    from amct_torch.inputs.data import Preprocess
    return instance(Preprocess)(value, name)


def _data(value: Any, name: str) -> Any:
    """Calibration or report data: a path (str or os.PathLike, as str), an array or an
    iterable of batches; bytes and a bare string of nothing are refused."""
    if isinstance(value, (bytes, bytearray)):
        raise ArgumentError(f"{name} must be a path, an array or an iterable of batches, got bytes")
    return path_arg(value, name) if isinstance(value, (str, os.PathLike)) else value


def _device(value: Any, name: str) -> str:
    """A device name ("cpu", "cuda:1", "auto") or a ``torch.device`` (as its name)."""
    if isinstance(value, str) or type(value).__name__ == "device":
        return str(value)
    raise ArgumentError(f"{name} must be a device name such as 'cpu' or 'cuda:0', got {type(value).__name__}")


@dataclass
class QuantizeOptions:
    """Everything ``quantize`` takes (its docstring says what each does)."""

    model_file: str = option(MISSING, "the deploy prototxt", path_arg)
    weights_file: str = option(MISSING, "the caffemodel", path_arg)
    calibration_data: Any = option(MISSING, "the calibration data (``quantize``'s docstring)", _data)
    config: Optional[str] = option(
        None, "None (defaults), a quant.cfg or a JSON quant config", opt(path_arg),
        cli=dict(flags=("-c", "--config"), help="quant.cfg (AMCT's simplified config) or a JSON quant "
                                                "config; default: quantize every quantizable layer with IFMR + ARQ"))
    output: str = option("amct_output/model", "the path prefix of every output", path_arg,
                         cli=dict(flags=("-o", "--output"), help="output path prefix (default: %(default)s)"))
    batch_num: Optional[int] = option(
        None, "calibration batches (default: the config's batch_num)", opt(positive_int),
        cli=dict(flags=("--batch-num",), type="positive"))
    batch_size: Optional[int] = option(
        None, "samples per batch (default: spread the data over batch-num batches; without DATA the "
              "data layer's batch_size)", opt(positive_int), cli=dict(flags=("--batch-size",), type="positive"))
    device: Optional[str] = option(None, "cpu, cuda, cuda:1 ... (default: cuda if available)", opt(_device),
                                   cli=dict(flags=("--device",), default="auto"))
    preprocess: Optional[Preprocess] = option(None, "how images become the net's input", opt(_preprocess))
    skip_layers: Optional[Sequence[str]] = option(
        None, "comma-separated layers not to quantize (without --config)", opt(names_arg),
        cli=dict(flags=("--skip-layers",), type="names"))
    activation_offset: bool = option(True, "asymmetric activations (False: offset_d = 0)", bool_arg)
    save_type: Optional[str] = option(
        "Both", "Caffe models to write (default: %(default)s)", opt(one_of(*SAVE_TYPES)),
        cli=dict(flags=("--save-type",), choices=SAVE_TYPES))
    onnx: Union[bool, str] = option(False, "also write the float and the QDQ ONNX model (True or the "
                                           "activation type)", either(bool_arg, one_of(*ONNX_ACTIVATIONS)))
    onnx_speed: bool = option(False, "the QDQ model's opt-in speed mode", bool_arg)
    onnx_outputs: Optional[Sequence[str]] = option(
        None, "comma-separated blob names: write the ONNX models up to these outputs only "
              "(e.g. before a layer ONNX cannot express exactly)", opt(names_arg),
        cli=dict(flags=("--onnx-outputs",), type="names"))
    report: bool = option(True, "write the per-layer report", bool_arg)
    report_data: Any = option(None, "the report's data (default: held-out calibration batches)", opt(_data))
    report_batches: int = option(2, "the report's held-out batches", non_negative_int)
    ifmr_mode: str = option(
        "streaming", "IFMR statistics: streaming (memory-bounded, default) or exact (AMCT's keep-everything)",
        one_of("streaming", "exact"), cli=dict(flags=("--ifmr-mode",), choices=("streaming", "exact")))
    quiet: bool = option(False, "no progress output", bool_arg)
    improve: Union[None, str, Sequence[str]] = option(
        None, "opt-in improvements beyond AMCT (default: none, AMCT's result), "
              f"comma-separated, or all: {', '.join(IMPROVEMENTS)}; applied in that "
              "order and each kept per layer only where it lowers the output error on "
              "held-out calibration data, never leaving a net output worse than the default",
        cli=dict(flags=("--improve",), type="improvements", metavar="LIST"))
    distributed: bool = option(
        False, "run under torchrun: each process calibrates its share of the batches "
               "(NCCL on GPUs, gloo on CPU); rank 0 writes the outputs", bool_arg,
        cli=dict(flags=("--distributed",), action="store_true"))
    checkpoint: Optional[str] = option(
        None, "save the calibration state after each batch to PATH and resume from it "
              "if it exists (a killed job continues with the same result)", opt(path_arg),
        cli=dict(flags=("--checkpoint",), metavar="PATH"))
    onnx_target: str = option("onnxruntime", "the runtime the QDQ model is laid out for",
                              one_of(*ONNX_TARGETS))
    allow_unknown_fields: bool = option(False, "build from a prototxt with fields this tool does not read")

    def validate(self) -> QuantizeOptions:
        """Refuse bad settings (before any file is read or written); returns self."""
        fields = {k: getattr(self, k) for k in QUANTIZE_ARGS}
        for k, v in check_values("quantize()", fields, QUANTIZE_ARGS).items():
            setattr(self, k, v)
        for p, what in ((self.model_file, "model file"), (self.weights_file, "weights file")):
            if not isinstance(p, (str, os.PathLike)) or isinstance(p, bytes):
                raise ModelError(f"{what} must be a path (str or os.PathLike), got {type(p).__name__}")
            check_regular_file(os.fspath(p), what, ModelError)
        if self.onnx:  # a target that cannot express the settings: refused before any work
            from amct_torch.export.onnx.targets import check_options
            check_options(self.onnx_target, self.activation_offset, self.config, self.onnx_speed)
        if self.batch_num is not None:  # bounded: an absurd count overflowed the config's field
            self.batch_num = check_batch_num(self.batch_num, file=self.data_path, error=ConfigError)
        if self.checkpoint is not None:  # a FIFO blocks, a missing folder failed after batch 1
            check_checkpoint_path(os.fspath(self.checkpoint), error=CalibrationError)
        try:  # a list, a comma-separated string or "all", held as the tuple in applying order
            self.improve = improvement_list(self.improve)
        except ValueError as err:
            raise AmctError(str(err)) from None
        self.output = check_output_name(self.output, "output", prefix_suffixes())
        self._check_dropped()
        return self

    def _check_dropped(self) -> None:
        """Refuse settings the job would otherwise drop without a word: what a config file
        decides, ONNX settings without the ONNX model, a target that fixes the activation type
        asked differently, ``distributed`` outside a torchrun job."""
        if self.config is not None and self.skip_layers:
            raise ConfigError("skip_layers (--skip-layers) applies only without a config: the "
                              "config decides what is skipped (quant.cfg: skip_layers; JSON: "
                              "quant_enable false per layer)", file=os.fspath(self.config))
        if self.config is not None and not self.activation_offset:
            raise ConfigError("activation_offset False (--no-activation-offset) applies only "
                              "without a config: set activation_offset: false in the config",
                              file=os.fspath(self.config))
        if not self.onnx and (self.onnx_outputs or self.onnx_speed):
            raise AmctError("onnx_outputs (--onnx-outputs) and onnx_speed (--onnx-quantize-eltwise) "
                            "shape the ONNX model: ask for it too (--onnx)")
        if isinstance(self.onnx, str):
            fixed = get_target(self.onnx_target).activations
            if fixed is not None and fixed != self.onnx:
                raise AmctError(f"--onnx-target {self.onnx_target} writes {fixed} activations; "
                                f"--onnx-activations {self.onnx} would be ignored (leave it out)")
        if self.distributed:
            import torch.distributed as dist

            from amct_torch.calibration.distributed import launched_by_torchrun
            if not launched_by_torchrun() and not (dist.is_available() and dist.is_initialized()):
                raise AmctError("distributed (--distributed) needs a torchrun job (WORLD_SIZE and "
                                "RANK unset): run it with torchrun --nproc_per_node=N, or leave "
                                "--distributed out")

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


#: what each argument of ``quantize`` / ``QuantizeOptions`` must be (from the fields)
QUANTIZE_ARGS = {f.name: f.metadata["arg"] for f in fields(QuantizeOptions) if f.metadata.get("arg")}
