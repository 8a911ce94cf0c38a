"""Names of the files a save writes, and the choices that select them, in one place.

Why a module of its own, without torch: the command line lists these choices in ``--help``
(which must not import torch), the API validates them, and the exporters and the one-call
job name the same files; one definition keeps them from drifting apart.
"""
from __future__ import annotations

#: ``save_model``'s save_type values (AMCT's)
SAVE_TYPES = ("Fakequant", "Deploy", "Both")
#: activation types of the ONNX QDQ model
ONNX_ACTIVATIONS = ("int8", "uint8")
#: runtimes the ONNX QDQ model can be laid out for (``--onnx-target``; the first is the default)
ONNX_TARGETS = ("onnxruntime", "openvino", "tensorrt")
#: opt-in improvements beyond AMCT's result (``quantize(improve=...)``), in their order of
#: application: cross-layer equalization changes the weights (AMCT's calibration then runs again
#: on them); then, layer by layer in one sequential pass, the output-error activation range, the
#: learned weight rounding (on the input so quantized) and the bias correction (of the output
#: with both) refine the calibrated model (docs/algorithms.md)
IMPROVEMENTS = ("cle", "output_ranges", "adaround", "bias_correction")


def improvement_list(value: object) -> tuple[str, ...]:
    """``improve`` as the tuple of improvements to apply, in ``IMPROVEMENTS`` order: None or ""
    is none; a name, a comma-separated string or a list of names; "all" is every one. An
    unknown name is a ValueError naming it and the choices."""
    if value is None:
        return ()
    if isinstance(value, str):
        names = [v.strip() for v in value.split(",") if v.strip()]
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        names = [v.strip() for v in value]
    else:
        raise ValueError(f"improve must be a name, a comma-separated string or a list of names, got {value!r}")
    if "all" in names:
        return IMPROVEMENTS
    bad = [n for n in names if n not in IMPROVEMENTS]
    if bad:
        raise ValueError(f"unknown improvement {bad[0]!r}: choose from {', '.join(IMPROVEMENTS)} or all")
    return tuple(n for n in IMPROVEMENTS if n in names)


#: kind → the suffix of every file a calibrate run may write under its prefix (AMCT's names;
#: the one place that spells them: writers ask ``output_path``, a rerun removes the ones it does
#: not write and nothing else, the command's help lists them)
SUFFIXES = {
    "config": "_quant_config.json",
    "record": "_record.txt",
    "fake_quant_model": "_fake_quant_model.prototxt",
    "fake_quant_weights": "_fake_quant_weights.caffemodel",
    "deploy_model": "_deploy_model.prototxt",
    "deploy_weights": "_deploy_weights.caffemodel",
    "quant": "_quant.json",
    "report": "_layer_report.json",
    "html_report": "_report.html",
    "onnx_float": "_float.onnx",
    "onnx": "_quant.onnx",
}
PREFIX_SUFFIXES = tuple(SUFFIXES.values())
#: the page ``amct-torch test --quantized PREFIX`` writes under the prefix (not a calibrate
#: output: a calibrate rerun leaves it, and its summary names the models it scored)
TEST_REPORT_SUFFIX = "_test_report.html"


def output_path(prefix: str, kind: str) -> str:
    """The path of the ``kind`` output (a key of ``SUFFIXES``) under ``prefix``."""
    return prefix + SUFFIXES[kind]


def model_kinds(save_type: str) -> list[str]:
    """The kinds ``save_model`` writes for ``save_type``: the fake-quant and/or deploy Caffe
    models and the quant info JSON."""
    out = []
    if save_type in ("Fakequant", "Both"):
        out += ["fake_quant_model", "fake_quant_weights"]
    if save_type in ("Deploy", "Both"):
        out += ["deploy_model", "deploy_weights"]
    return out + ["quant"]


def model_paths(save_path: str, save_type: str) -> list[str]:
    """The files ``save_model`` writes for ``save_type`` (``model_kinds``)."""
    return [output_path(save_path, k) for k in model_kinds(save_type)]


def prefix_outputs(prefix: str) -> list[str]:
    """Every output path a calibrate run may write under ``prefix``."""
    return [f"{prefix}{suffix}" for suffix in PREFIX_SUFFIXES]
