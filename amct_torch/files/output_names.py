"""The names of the one-call job's own files.

Why a module of its own, without torch: the command line lists these in ``--help`` (which
must not import torch) and the API validates them. Each output format declares its own file
names and choices (``amct_torch.export.caffe``, ``amct_torch.export.onnx``; ``formats.py``
gathers the names with these).
"""
from __future__ import annotations

#: kind → the suffix of the job's own files under its prefix (AMCT's names; the models' are
#: declared by their exporters, ``amct_torch.export.formats``)
SUFFIXES = {
    "config": "_quant_config.json",
    "record": "_record.txt",
    "report": "_layer_report.json",
    "html_report": "_report.html",
}
#: the page ``amct-torch test --quantized PREFIX`` writes under the prefix (not a calibrate
#: output: a calibrate rerun leaves it, and its summary names the models it scored)
TEST_REPORT_SUFFIX = "_test_report.html"


def output_path(prefix: str, kind: str) -> str:
    """The path of the job's ``kind`` output (a key of ``SUFFIXES``) under ``prefix``."""
    return prefix + SUFFIXES[kind]
