"""``amct-torch test``: what ``caffe test`` prints, for the float model and its quantized forms.

Why: a Caffe user decides whether an int8 model ships on ``caffe test -model train_val.prototxt
-weights w.caffemodel -iterations N``: N forward passes of the TEST phase, every net output
averaged over the iterations. Here the same numbers come without Caffe, for the float model
and, given a calibrate output prefix, for each quantized form present (the fake-quant and
deploy Caffe models, the QDQ ONNX model run in ONNX Runtime): the inference part runs in its
runtime, the metric and loss layers in torch (caffe/head.py), all on the same batches of the
net's TEST data layers, whose read-ahead decodes while the forwards run.
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np
import torch

from amct_torch.arguments import bool_arg, checked, instance, opt, path_arg, positive_int
from amct_torch.caffe.head import NetHead, NetOutput, net_outputs
from amct_torch.errors import AmctError, DataError, ModelError
from amct_torch.export.caffe import SUFFIXES as CAFFE_SUFFIXES
from amct_torch.export.onnx import SUFFIXES as ONNX_SUFFIXES
from amct_torch.inputs.caffe_data import PhaseData
from amct_torch.quality.ap_versions import AP_VERSIONS, DEFAULT_AP_VERSION

log = logging.getLogger(__name__)

#: the forms ``test`` scores, in its table's order: name -> (label, the files under a prefix)
FORMS = {"float": "float", "fake_quant": "fake-quant Caffe", "deploy": "deploy Caffe",
         "onnx": "int8 ONNX (ONNX Runtime)"}


@dataclass
class FormScores:
    """One model's scores: ``outputs`` blob -> mean over the iterations (Caffe's order),
    ``loss`` the mean weighted loss, how many images and seconds it took."""

    form: str
    files: list[str]
    outputs: dict[str, float]
    loss: float
    images: int
    seconds: float

    @property
    def images_per_second(self) -> float:
        return self.images / self.seconds if self.seconds > 0 else float("nan")


@dataclass
class CaffeTestResult:
    """``caffe test``'s numbers for each form (``forms``, float first), the net's outputs
    (name, loss weight) and the calibrate output prefix the quantized forms came from."""

    iterations: int
    batch_size: int
    outputs: list[NetOutput]
    forms: list[FormScores] = field(default_factory=list)
    quantized: Optional[str] = None
    #: output -> what its figure is when not the mean of a scalar (e.g. "mAP, 11point")
    figures: dict[str, str] = field(default_factory=dict)

    def drop(self, form: FormScores, name: str) -> float:
        """float's mean minus ``form``'s for output ``name`` (a positive drop is a loss of
        accuracy)."""
        return self.forms[0].outputs[name] - form.outputs[name]

    def labels(self) -> list[tuple[str, str]]:
        """(output, its label in the tables): a loss output shows its loss weight, a tallied
        one what its figure is."""
        return [(o.name, o.name + (f" (* {o.loss_weight:g} loss)" if o.loss_weight else "")
                 + (f" ({self.figures[o.name]})" if o.name in self.figures else "")) for o in self.outputs]

    def report_html(self) -> str:
        """The visual report as an HTML fragment: the summary and the accuracy section (each
        output of the float model and of each quantized form, with its drop)."""
        from amct_torch.quality.html_report import caffe_test_html
        return caffe_test_html(self, FORMS)

    def _repr_html_(self) -> str:
        """Jupyter shows the report inline."""
        return self.report_html()

    def write_html(self, path: str) -> str:
        """Write the report as a self-contained page at ``path`` (atomically); returns ``path``."""
        from amct_torch.quality.html_report import write_page
        write_page(path, self.report_html(), f"amct-torch test: {os.path.basename(self.forms[0].files[0])}")
        return path

    def as_json(self) -> dict:
        return {"iterations": self.iterations, "batch_size": self.batch_size,
                "outputs": [{"name": o.name, "loss_weight": o.loss_weight,
                             **({"figure": self.figures[o.name]} if o.name in self.figures else {})}
                            for o in self.outputs],
                "forms": [{"form": f.form, "files": f.files, "outputs": f.outputs, "loss": f.loss,
                           "images": f.images, "seconds": round(f.seconds, 3),
                           "images_per_second": round(f.images_per_second, 2),
                           "drop": {n: self.drop(f, n) for n in f.outputs}} for f in self.forms]}


class Scores:
    """Caffe's running sums: every element of every scalar output summed in float32 over the
    iterations, and the iteration's loss (sum of loss weight x loss top); an output with a
    tally (``NetHead.tallies``: DetectionEvaluate's rows) feeds it instead, and its figure is
    the tally's value (the mAP)."""

    def __init__(self, outputs: Sequence[NetOutput], tallies: Optional[dict[str, Any]] = None) -> None:
        self.outputs = list(outputs)
        self.tallies = dict(tallies or {})
        self.sums: dict[str, np.float32] = {}
        self.loss = np.float32(0.0)
        self.iterations = 0

    def add(self, values: dict[str, torch.Tensor]) -> None:
        it_loss = np.float32(0.0)
        for o in self.outputs:
            v = values.get(o.name)
            if v is not None and o.name in self.tallies:
                self.tallies[o.name].add(v)
                continue
            if v is None or v.numel() != 1:
                continue
            x = np.float32(float(v.reshape(())))
            self.sums[o.name] = np.float32(self.sums.get(o.name, np.float32(0.0)) + x)
            if o.loss_weight:
                it_loss = np.float32(it_loss + np.float32(o.loss_weight) * x)
        self.loss = np.float32(self.loss + it_loss)
        self.iterations += 1

    def means(self) -> dict[str, float]:
        n = np.float32(max(self.iterations, 1))
        out = {k: float(np.float32(v / n)) for k, v in self.sums.items()}
        out.update({k: float(t.value()) for k, t in self.tallies.items()})
        return out

    def mean_loss(self) -> float:
        return float(np.float32(self.loss / np.float32(max(self.iterations, 1))))


Forward = Callable[[dict[str, np.ndarray]], dict[str, torch.Tensor]]


def torch_forward(gm: Any, device: torch.device) -> Forward:
    """The inference part of a loaded graph on ``device``: batch -> its outputs and the batch's
    data tops, as tensors on ``device``."""
    gm = gm.to(device).eval()
    names = [n for n, _ in gm.caffe_inputs]

    def forward(batch: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        blobs = {k: torch.from_numpy(np.ascontiguousarray(v)).to(device) for k, v in batch.items()}
        missing = [n for n in names if n not in blobs]
        if missing:
            raise DataError(f"the data layers give no blob '{missing[0]}' that the net reads")
        with torch.no_grad():
            out = gm(*[blobs[n] for n in names])
        blobs.update(out)
        return blobs
    return forward


def onnx_forward(path: str, device: torch.device) -> Forward:
    """The ONNX model in ONNX Runtime (CPU; CUDA when the device is CUDA and the provider is
    there): batch -> its outputs and the batch's data tops, as tensors on ``device``."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise AmctError("scoring the ONNX model needs ONNX Runtime: pip install 'amct-torch[onnxruntime]'",
                        file=path) from None
    providers = ["CPUExecutionProvider"]
    if device.type == "cuda" and "CUDAExecutionProvider" in ort.get_available_providers():
        providers.insert(0, "CUDAExecutionProvider")
    try:
        sess = ort.InferenceSession(path, providers=providers)
    except Exception as err:  # noqa: BLE001 - ORT raises its own types for unreadable models
        raise ModelError(f"ONNX Runtime cannot load the model: {str(err).splitlines()[0]}", file=path) from None
    inputs = [i.name for i in sess.get_inputs()]
    outputs = [o.name for o in sess.get_outputs()]

    def forward(batch: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        missing = [n for n in inputs if n not in batch]
        if missing:
            raise DataError(f"the data layers give no blob '{missing[0]}' that the ONNX model reads", file=path)
        got = sess.run(outputs, {n: np.ascontiguousarray(batch[n], np.float32) for n in inputs})
        blobs = {k: torch.from_numpy(np.asarray(v)).to(device) for k, v in batch.items()}
        blobs.update({n: torch.from_numpy(np.asarray(v)).to(device) for n, v in zip(outputs, got)})
        return blobs
    return forward


def quantized_forms(prefix: str) -> list[tuple[str, list[str]]]:
    """The quantized forms a calibrate output ``prefix`` holds: (form, its files)."""
    found = []
    for form, kinds in (("fake_quant", ("fake_quant_model", "fake_quant_weights")),
                        ("deploy", ("deploy_model", "deploy_weights")), ("onnx", ("onnx",))):
        files = [prefix + {**CAFFE_SUFFIXES, **ONNX_SUFFIXES}[k] for k in kinds]
        if all(os.path.isfile(f) for f in files):
            found.append((form, files))
    return found


def _scorable(forms: list[tuple[str, list[str]]]) -> list[tuple[str, list[str]]]:
    """The forms this install can score, decided before any forward: without ONNX Runtime the
    int8 ONNX model is left out with one warning (the Caffe forms are still scored), instead of
    an error after the other forms ran."""
    if not any(form == "onnx" for form, _ in forms):
        return forms
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        onnx_file = next(files[0] for form, files in forms if form == "onnx")
        log.warning("%s: not scored: ONNX Runtime is not installed (pip install 'amct-torch[onnxruntime]')",
                    onnx_file)
        return [(form, files) for form, files in forms if form != "onnx"]
    return forms


def score(forward: Forward, head: NetHead, outputs: Sequence[NetOutput], data: PhaseData,
          iterations: int, label: str, quiet: bool, start: int = 0,
          ap_version: str = DEFAULT_AP_VERSION) -> tuple[Scores, int, float]:
    """``iterations`` batches through ``forward`` and ``head``: (the sums, images, seconds)."""
    from tqdm import tqdm

    sums = Scores(outputs, head.tallies(ap_version))
    images = 0
    t0 = time.perf_counter()
    batches = data.batches(start)
    with tqdm(total=iterations, desc=label, unit="batch", disable=quiet, leave=False,
              dynamic_ncols=True) as bar:
        for _ in range(iterations):
            batch = next(batches)
            values = head.run(forward(batch))
            sums.add(values)
            images += data.batch_size
            bar.update(1)
    return sums, images, time.perf_counter() - t0


@checked(model_file=path_arg, weights_file=path_arg, iterations=positive_int, quantized=opt(path_arg),
         device=opt(instance(str)), quiet=bool_arg, ap_version=instance(str))
def caffe_test(model_file: str, weights_file: str, *, iterations: int = 50, quantized: Optional[str] = None,
               device: Optional[str] = None, quiet: bool = False,
               ap_version: str = DEFAULT_AP_VERSION) -> CaffeTestResult:
    """``caffe test`` without Caffe: ``iterations`` batches of the net's TEST-phase data layers
    through the float model and, with ``quantized`` (a calibrate ``--output`` prefix), each
    quantized form it holds (fake-quant and deploy Caffe models, the QDQ ONNX model in ONNX
    Runtime), on the same batches. Every scalar net output (accuracy, loss...) is averaged over
    the iterations as ``caffe test`` prints it; a DetectionEvaluate output (SSD) gives the mAP of
    its rows over all the iterations, ``ap_version`` "11point", "MaxIntegral" or "Integral" (as
    the SSD fork's solver); ``CaffeTestResult.drop`` gives float minus int8."""
    from amct_torch.caffe.graph import load_caffe
    from amct_torch.calibration.loop import resolve_device

    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise AmctError(f"iterations must be a positive integer, got {iterations!r}")
    if ap_version not in AP_VERSIONS:
        raise AmctError(f"ap_version must be one of {', '.join(AP_VERSIONS)}, got {ap_version!r}")
    for p, what in ((model_file, "model file"), (weights_file, "weights file")):
        if not os.path.isfile(p):
            raise ModelError(f"{what} not found", file=str(p))
    forms = quantized_forms(quantized) if quantized is not None else []
    if quantized is not None and not forms:
        raise AmctError("no quantized model under this prefix (expected the files calibrate writes: "
                        "_fake_quant_model.prototxt, _deploy_model.prototxt or _quant.onnx)", file=quantized)
    forms = _scorable(forms)
    dev = resolve_device(device)
    gm = load_caffe(model_file, weights_file)
    data = PhaseData(gm.meta.get("caffe_data_layers", []), model_file)
    outputs = [o for o in net_outputs(gm)]
    head = NetHead(gm.meta.get("caffe_head", []), model_file).to(dev)
    result = CaffeTestResult(iterations, data.batch_size, outputs, quantized=quantized,
                             figures={k: t.label for k, t in head.tallies(ap_version).items()})

    def run(form: str, files: list[str], forward: Forward) -> None:
        sums, images, secs = score(forward, head, outputs, data, iterations, FORMS[form], quiet,
                                   ap_version=ap_version)
        result.forms.append(FormScores(form, files, sums.means(), sums.mean_loss(), images, secs))

    try:
        run("float", [model_file, weights_file], torch_forward(gm, dev))
        del gm
        for form, files in forms:
            if form == "onnx":
                run(form, files, onnx_forward(files[0], dev))
            else:
                run(form, files, torch_forward(load_caffe(files[0], files[1]), dev))
    finally:
        data.close()
    result.outputs = [o for o in outputs if o.name in result.forms[0].outputs]
    return result


def format_result(result: CaffeTestResult) -> str:
    """The table ``test`` prints: one row per output, one column per form, then the drop."""
    forms = result.forms
    head = ["output"] + [FORMS[f.form] for f in forms] + [f"drop ({FORMS[f.form].split()[0]})" for f in forms[1:]]
    rows = []
    for key, name in result.labels():
        cells = [f"{f.outputs[key]:.6g}" for f in forms]
        cells += [f"{result.drop(f, key):+.6g}" for f in forms[1:]]
        rows.append([name] + cells)
    rows.append(["images/s"] + [f"{f.images_per_second:.1f}" for f in forms] + [""] * (len(forms) - 1))
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [f"{result.iterations} iteration(s) of {result.batch_size} image(s)", fmt.format(*head)]
    lines += [fmt.format(*r) for r in rows]
    return "\n".join(lines)
