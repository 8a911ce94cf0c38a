"""The ONNX output models: the (BN-fused) float model and its QDQ model, with the layer
mappings, the integer form, the opt-in residual/eltwise Q/DQ and the preflight that finds an
unexportable graph before calibration. See docs/export.md.

Nothing is imported here: the ``onnx`` package costs ~0.5 s to import and most jobs write no
ONNX model; import the module you need (``amct_torch.export.onnx.qdq``). The file names are
declared here, where the writers and the exporter (``exporter.py``) both read them."""

#: kind -> the suffix of each file the ONNX exporter writes under an output prefix
SUFFIXES = {"onnx_float": "_float.onnx", "onnx": "_quant.onnx"}
