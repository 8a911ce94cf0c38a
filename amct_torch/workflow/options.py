"""The settings of one ``quantize`` job, each declared once, checked before any work.

Why an object: the one-call job has some twenty settings; carrying them as one validated
value keeps the steps (plan, calibrate, write) short and lets each read only what it needs.
Each field carries its default, its help, its argument check (``amct_torch.arguments``) and
its ``calibrate`` arguments (``option_declaration.py``): ``QUANTIZE_ARGS`` (``quantize``'s and
``validate``'s checks), ``quantize``'s docstring and the command's arguments are made from them.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import MISSING, dataclass, fields
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
from amct_torch.export import ONNX_ACTIVATIONS, ONNX_TARGETS, SAVE_TYPES, check_exporter_options, prefix_suffixes
from amct_torch.files import check_output_name
from amct_torch.improve import IMPROVEMENTS, improvement_list
from amct_torch.inputs import (
    add_preprocess_options,
    check_batch_num,
    check_checkpoint_path,
    check_regular_file,
    preprocess_from,
)
from amct_torch.workflow.option_declaration import arguments_doc, flag, option

if TYPE_CHECKING:
    from amct_torch.inputs import Preprocess


def _preprocess(value: Any, name: str) -> Any:
    """A ``Preprocess`` (imported when checked: declaring the options needs no torch)."""
    from amct_torch.inputs import Preprocess
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


def _onnx_from(args: Any) -> Union[bool, str]:
    """``--onnx`` and ``--onnx-activations``: False, True or the asked activation type."""
    return (args.onnx_activations or True) if args.onnx else False


@dataclass
class QuantizeOptions:
    """Everything ``quantize`` takes, each field declared once (``option``)."""

    model_file: str = option(MISSING, "deploy, test or train_val prototxt", path_arg, flag("model"))
    weights_file: str = option(MISSING, "caffemodel", path_arg, flag("weights"))
    calibration_data: Any = option(
        MISSING, "an iterable of batches (tensors or arrays N×C×H×W), one array of samples, or a path "
                 "(a folder of images or .npy/.npz files, or one .npy/.npz file; images are preprocessed "
                 "by ``preprocess``); None: the net's own TEST-phase data layers (a train/test "
                 "prototxt), ``batch_num`` batches of the layer's batch_size (or ``batch_size``), the "
                 "report's held-out batches the ones after them", _data,
        flag("data", nargs="?", help="calibration data: a folder of images, a folder of .npy/.npz, or one "
                                     ".npy/.npz file; left out: the TEST-phase data layer of a train/test prototxt"))
    config: Optional[str] = option(
        None, "None (defaults: every quantizable layer, IFMR + ARQ), a quant.cfg or a JSON quant config",
        opt(path_arg),
        flag("-c", "--config", help="quant.cfg (AMCT's simplified config) or a JSON quant config; default: "
                                    "quantize every quantizable layer with IFMR + ARQ"))
    output: str = option(
        "amct_output/model", "the path prefix of every output: ``{output}_quant_config.json``, "
                             "``{output}_record.txt`` and the models", path_arg,
        flag("-o", "--output", help="output path prefix (default: %(default)s)"))
    batch_num: Optional[int] = option(
        None, "calibration batches (default: the config's batch_num)", opt(positive_int),
        flag("--batch-num", type="positive"))
    batch_size: Optional[int] = option(
        None, "samples per batch (default: the data spread over the batches; without data the data "
              "layer's batch_size)", opt(positive_int),
        flag("--batch-size", type="positive", help="samples per batch (default: spread the data over "
                                                   "batch-num batches; without DATA the data layer's batch_size)"))
    device: Optional[str] = option(None, "cpu, cuda, cuda:1 ... (default: cuda if available)", opt(_device),
                                   flag("--device", default="auto"))
    preprocess: Optional[Preprocess] = option(
        None, "how images become the net's input (Caffe's transform_param: channel order, mean, scale, "
              "resize, crop)", opt(_preprocess), add_preprocess_options, read=preprocess_from)
    skip_layers: Optional[Sequence[str]] = option(
        None, "layers not to quantize (without a config)", opt(names_arg),
        flag("--skip-layers", type="names", help="comma-separated layers not to quantize (without --config)"))
    activation_offset: bool = option(
        True, "asymmetric activations; False: symmetric, offset_d = 0 (without a config)", bool_arg,
        flag("--no-activation-offset", action="store_false",
             help="symmetric activations (offset_d = 0; without --config)"))
    save_type: Optional[str] = option(
        "Both", "Caffe models to write: Fakequant, Deploy or Both (default); None: the record only",
        opt(one_of(*SAVE_TYPES)),
        flag("--save-type", choices=SAVE_TYPES, help="Caffe models to write (default: %(default)s)"))
    onnx: Union[bool, str] = option(
        False, "also write the float and the QDQ ONNX model (``{output}_float.onnx``, "
               "``{output}_quant.onnx``): True, or the activation type", either(bool_arg, one_of(*ONNX_ACTIVATIONS)),
        (flag("--onnx", action="store_true", help="also write the float and the QDQ ONNX model"),
         flag("--onnx-activations", choices=ONNX_ACTIVATIONS, default=None, needs="onnx",
              help="activation type of the QDQ model: uint8 (zero point offset_d+128, default: the same "
                   "numbers as int8, and ONNX Runtime fuses more int8 kernels) or int8 (zero point = offset_d)")),
        read=_onnx_from)
    onnx_speed: bool = option(
        False, "ONNX speed mode (opt-in, no longer AMCT-exact): also quantize residual conv outputs and "
               "Eltwise SUMs so that ONNX Runtime runs every conv and add as an int8 kernel", bool_arg,
        flag("--onnx-quantize-eltwise", action="store_true", needs="onnx",
             help="ONNX speed mode (opt-in, no longer AMCT-exact): also quantize residual conv outputs and "
                  "Eltwise SUMs so ONNX Runtime runs every conv and add as an int8 kernel; use with "
                  "--onnx-activations uint8"))
    onnx_outputs: Optional[Sequence[str]] = option(
        None, "blob names: write the ONNX models up to these outputs only (e.g. before a layer ONNX "
              "cannot express exactly)", opt(names_arg),
        flag("--onnx-outputs", type="names", needs="onnx",
             help="comma-separated blob names: write the ONNX models up to these outputs only "
                  "(e.g. before a layer ONNX cannot express exactly)"))
    report: bool = option(True, "compare every quantized layer's output with the float model's and write "
                                "``{output}_layer_report.json``", bool_arg,
                          read=lambda args: args.report_batches > 0)
    report_data: Any = option(None, "the report's data (default: held-out calibration batches)", opt(_data))
    report_batches: int = option(
        2, "the report's held-out batches of the calibration data (when there are none: the calibration "
           "batches)", non_negative_int,
        flag("--report-batches", type="non_negative", help="held-out batches for the per-layer report (0: none)"),
        read=lambda args: max(args.report_batches, 1))
    ifmr_mode: str = option(
        "streaming", "IFMR statistics: streaming (memory-bounded, default) or exact (AMCT's keep-everything)",
        one_of("streaming", "exact"), flag("--ifmr-mode", choices=("streaming", "exact")))
    quiet: bool = option(False, "no progress bar", bool_arg,
                         flag("-q", "--quiet", action="store_true",
                              help="no progress bar; warnings and errors are still logged"))
    improve: Union[None, str, Sequence[str]] = option(
        None, "opt-in improvements beyond AMCT (default: none, AMCT's result), "
              f"comma-separated, or all: {', '.join(IMPROVEMENTS)}; applied in that "
              "order and each kept per layer only where it lowers the output error on "
              "held-out calibration data, never leaving a net output worse than the default",
        cli=flag("--improve", type="improvements", metavar="LIST"))
    distributed: bool = option(
        False, "run under torchrun: each process calibrates its share of the batches "
               "(NCCL on GPUs, gloo on CPU); rank 0 writes the outputs", bool_arg,
        flag("--distributed", action="store_true"))
    checkpoint: Optional[str] = option(
        None, "save the calibration state after each batch to PATH and resume from it "
              "if it exists (a killed job continues with the same result)", opt(path_arg),
        flag("--checkpoint", metavar="PATH"))
    onnx_target: str = option(
        ONNX_TARGETS[0], "the runtime the QDQ model is laid out for: onnxruntime, openvino (plain QDQ, "
                         "uint8) or tensorrt (int8, zero point 0: needs symmetric activations, refused "
                         "before calibration otherwise); the target fixes the activation type",
        one_of(*ONNX_TARGETS),
        flag("--onnx-target", choices=ONNX_TARGETS, default=None, needs="onnx",
             help=f"runtime the QDQ model is laid out for (default: {ONNX_TARGETS[0]}): openvino "
                  "(plain QDQ, uint8) or tensorrt (int8, zero point 0: needs --no-activation-offset "
                  "or a config with activation_offset: false); the target fixes the activation type"),
        read=lambda args: args.onnx_target or ONNX_TARGETS[0])
    allow_unknown_fields: bool = option(
        False, "run a prototxt whose layers have fields this tool does not read (a Caffe fork's parameters; "
               "'inspect' lists them) without those fields; refused otherwise", bool_arg,
        flag("--allow-unknown-fields", action="store_true"))

    def validate(self) -> QuantizeOptions:
        """Refuse bad settings (before any file is read or written); returns self."""
        fields = {k: getattr(self, k) for k in QUANTIZE_ARGS}
        for k, v in check_values("quantize()", fields, QUANTIZE_ARGS).items():
            setattr(self, k, v)
        for p, what in ((self.model_file, "model file"), (self.weights_file, "weights file")):
            if not isinstance(p, (str, os.PathLike)) or isinstance(p, bytes):
                raise ModelError(f"{what} must be a path (str or os.PathLike), got {type(p).__name__}")
            check_regular_file(os.fspath(p), what, ModelError)
        check_exporter_options(self)  # each output format refuses its own settings before any work
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
        decides, ``distributed`` outside a torchrun job (a format's own settings: its
        ``Exporter.check_options``)."""
        if self.config is not None and self.skip_layers:
            raise ConfigError("skip_layers (--skip-layers) applies only without a config: the "
                              "config decides what is skipped (quant.cfg: skip_layers; JSON: "
                              "quant_enable false per layer)", file=os.fspath(self.config))
        if self.config is not None and not self.activation_offset:
            raise ConfigError("activation_offset False (--no-activation-offset) applies only "
                              "without a config: set activation_offset: false in the config",
                              file=os.fspath(self.config))
        if self.distributed:
            import torch.distributed as dist

            from amct_torch.calibration import launched_by_torchrun
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

#: ``quantize``'s arguments paragraph: each field's help
ARGUMENTS_DOC = arguments_doc(fields(QuantizeOptions))
