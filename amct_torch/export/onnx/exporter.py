"""The ONNX exporter: the float model and its QDQ model for the chosen runtime target.

Its check is the target's config check and the preflight (both models built with placeholder
factors and checked); for a target written as built (``runtime_targets.Target.streamed``) the
float model is built before calibration and written beside it (``float_ahead.py``). Nothing
heavy is imported until one of these runs: the class is read by ``--help``."""
from __future__ import annotations

from typing import Any, Optional

from amct_torch.errors import AmctError
from amct_torch.export.exporter import Exporter, ExportInputs
from amct_torch.export.onnx import SUFFIXES
from amct_torch.export.onnx.runtime_targets import get_target

__all__ = ["OnnxExporter"]


class OnnxExporter(Exporter):
    """``_float.onnx`` and ``_quant.onnx`` when ``opts.onnx`` asks for them, laid out for
    ``opts.onnx_target``, cut at ``opts.onnx_outputs``, in the speed mode with ``opts.onnx_speed``."""

    label = "ONNX"
    suffixes = SUFFIXES
    _ahead: Any = None  # the float model written during calibration (FloatAhead), set by prepare

    @classmethod
    def check_options(cls, opts: Any) -> None:
        """A target that cannot express the settings, ONNX settings without the ONNX model, an
        activation type the target fixes otherwise: refused before any work."""
        if opts.onnx:
            from amct_torch.export.onnx.targets import check_options
            check_options(opts.onnx_target, opts.activation_offset, opts.config, opts.onnx_speed)
        elif opts.onnx_outputs or opts.onnx_speed:
            raise AmctError("onnx_outputs (--onnx-outputs) and onnx_speed (--onnx-quantize-eltwise) "
                            "shape the ONNX model: ask for it too (--onnx)")
        if isinstance(opts.onnx, str):
            fixed = get_target(opts.onnx_target).activations
            if fixed is not None and fixed != opts.onnx:
                raise AmctError(f"--onnx-target {opts.onnx_target} writes {fixed} activations; "
                                f"--onnx-activations {opts.onnx} would be ignored (leave it out)")

    def kinds(self) -> list[str]:
        return ["onnx_float", "onnx"] if self.opts.onnx else []

    @property
    def reads_batches(self) -> bool:  # the speed mode's extra factors come from the calibration batches
        return bool(self.opts.onnx_speed)

    def check(self, graph: Any) -> None:
        from amct_torch.export.onnx.preflight import preflight_onnx
        from amct_torch.export.onnx.targets import check_config

        opts = self.opts
        check_config(opts.onnx_target, graph.config, opts.config)  # names the config file
        preflight_onnx(graph.model, graph.config, activations=opts.onnx_activations, outputs=opts.onnx_outputs,
                       model_file=opts.model_file, speed=opts.onnx_speed, target=opts.onnx_target)

    def prepare(self, fused: Any, prefix: str) -> None:
        if not get_target(self.opts.onnx_target).streamed:
            return
        # the float model needs no calibration: built now, before the observers, and written
        # beside the calibration once the data checks passed
        from amct_torch.export.onnx.float_ahead import FloatAhead
        self._ahead = FloatAhead(fused, prefix, activations=self.opts.onnx_activations,
                                 outputs=self.opts.onnx_outputs, model_file=self.opts.model_file)

    def start(self) -> None:
        if self._ahead is not None:
            self._ahead.start()

    def write(self, inputs: ExportInputs) -> dict[str, str]:
        from amct_torch.export.onnx.qdq import export_onnx

        opts = self.opts
        float_staged: Optional[tuple[str, str]] = self._ahead.wait() if self._ahead is not None else None
        data = None
        if opts.onnx_speed:  # the extra factors of the speed mode
            data = [(b[0] if isinstance(b, tuple) else b).cpu().numpy() for b in inputs.batches]
        float_path, quant_path = export_onnx(
            inputs.graph.fused, inputs.records, inputs.prefix, activations=opts.onnx_activations,
            quantize_eltwise=opts.onnx_speed, calibration_data=data, file=inputs.record_file,
            outputs=opts.onnx_outputs, target=opts.onnx_target, model_file=getattr(inputs.graph, "model_file", None),
            float_graph=inputs.float_model, float_staged=float_staged)
        return {"onnx_float": float_path, "onnx": quant_path}

    def discard(self) -> None:
        if self._ahead is not None:  # its thread stopped, its file gone unless handed on
            self._ahead.discard()
