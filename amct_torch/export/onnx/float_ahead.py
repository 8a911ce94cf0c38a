"""The float ONNX model written while calibration runs.

Why: ``_float.onnx`` is the BN-fused float model, known as soon as BN is fused; nothing of it
waits for calibration. Writing it is mostly waiting (the disk taking a VGG-16's 553 MB, ONNX
Runtime loading the file for its check), which a helper thread does beside the calibration's
forwards instead of after them. The model is built (shapes probed, nodes made) on the
caller's thread before calibration starts, because probing runs the graph's modules; the
thread only streams the weights -- read, never written -- into a temporary file beside the
final path and checks it. ``export_onnx(float_staged=...)`` puts it in place together with
the quant model; until then it is a hidden temporary file of the job's staging folder.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

from torch import fx

from amct_torch.export.onnx import SUFFIXES
from amct_torch.files.atomic import remove_quietly
from amct_torch.runtime.helper_thread import HelperThread

__all__ = ["FloatAhead"]


class FloatAhead:
    """``{path_prefix}_float.onnx`` of ``graph`` (for a ``streamed`` target), built
    now (probing runs the graph's modules: before calibration attaches its observers) and
    written on a daemon thread from ``start()`` on: ``wait()`` gives its (temporary, final)
    pair or raises what writing or checking it raised; ``discard()`` stops caring (waits for
    the thread and removes the temporary file) -- call it on every path that does not hand the
    pair on. Both wait through signals (``helper_thread``)."""

    def __init__(self, graph: fx.GraphModule, path_prefix: str, *, activations: str = "uint8",
                 outputs: Optional[Sequence[str]] = None, dynamic_spatial: Optional[bool] = None,
                 model_file: Optional[str] = None) -> None:
        from amct_torch.export.onnx.qdq import _build

        self.path = path_prefix + SUFFIXES["onnx_float"]
        self._model_file = model_file
        self._built: Any = _build(graph, {}, activations, model_file, "float", outputs=outputs,
                                  dynamic_spatial=dynamic_spatial, stream=True)
        self._thread: Optional[HelperThread] = None
        self._taken = False

    def start(self) -> None:
        """Write and check the model on a helper thread (the job calls this once the cheap
        checks of its data have passed, right before the first batch)."""
        built, self._built = self._built, None
        self._thread = HelperThread(lambda: _write(built, self.path, self._model_file), "amct-float-onnx")

    def wait(self) -> tuple[str, str]:
        """The (temporary, final) pair, once the model is written and checked; from then on
        the caller owns the temporary file."""
        if self._thread is None:
            self.start()
        assert self._thread is not None
        self._thread.wait()
        if self._thread.error is not None:
            raise self._thread.error
        self._taken = True
        return self._thread.result

    def discard(self) -> None:
        """Drop the model: wait for the thread (if started) and remove the temporary file
        unless ``wait()`` handed it on."""
        self._built = None
        if self._thread is None:
            return
        self._thread.wait()
        if self._thread.result is not None and not self._taken:
            remove_quietly(self._thread.result[0])


def _write(built: Any, path: str, model_file: Optional[str]) -> tuple[str, str]:
    from amct_torch.export.onnx.qdq import _stage_checked
    return _stage_checked(built, path, model_file)
