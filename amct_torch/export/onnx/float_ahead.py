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

import threading
from typing import Any, Optional, Sequence

from torch import fx

from amct_torch.atomic import remove_quietly
from amct_torch.output_names import output_path

__all__ = ["FloatAhead"]


class FloatAhead:
    """``{path_prefix}_float.onnx`` of ``graph`` (the layout of target onnxruntime), built
    now and written on a daemon thread: ``wait()`` gives its (temporary, final) pair or raises
    what writing or checking it raised; ``discard()`` stops caring (waits for the thread and
    removes the temporary file) -- call it on every path that does not hand the pair on."""

    def __init__(self, graph: fx.GraphModule, path_prefix: str, *, activations: str = "uint8",
                 outputs: Optional[Sequence[str]] = None, dynamic_spatial: Optional[bool] = None,
                 model_file: Optional[str] = None) -> None:
        from amct_torch.export.onnx.qdq import _build

        self.path = output_path(path_prefix, "onnx_float")
        built = _build(graph, {}, activations, model_file, "float", outputs=outputs,
                       dynamic_spatial=dynamic_spatial, stream=True)
        self._staged: Optional[tuple[str, str]] = None
        self._error: Optional[BaseException] = None
        self._taken = False
        self._thread = threading.Thread(target=self._write, args=(built, model_file),
                                        name="amct-float-onnx", daemon=True)
        self._thread.start()

    def _write(self, built: Any, model_file: Optional[str]) -> None:
        from amct_torch.export.onnx.qdq import _stage_checked
        try:
            self._staged = _stage_checked(built, self.path, model_file)
        except BaseException as err:  # noqa: BLE001 - raised on the caller's thread by wait()
            self._error = err
        finally:
            del built  # the proto and the views of the weights

    def wait(self) -> tuple[str, str]:
        """The (temporary, final) pair, once the model is written and checked; from then on
        the caller owns the temporary file."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._staged is not None
        self._taken = True
        return self._staged

    def discard(self) -> None:
        """Wait for the thread and remove the temporary file unless ``wait()`` handed it on."""
        self._thread.join()
        if self._staged is not None and not self._taken:
            remove_quietly(self._staged[0])
