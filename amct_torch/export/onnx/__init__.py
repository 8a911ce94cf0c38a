"""The ONNX output models: the (BN-fused) float model and its QDQ model, with the layer
mappings, the integer form, the opt-in residual/eltwise Q/DQ and the preflight that finds an
unexportable graph before calibration. See docs/export.md.

Nothing is imported here: the ``onnx`` package costs ~0.5 s to import and most jobs write no
ONNX model; import the module you need (``amct_torch.export.onnx.qdq``). The file names and
activation types are declared here, where the writers, the exporter (``exporter.py``) and the
command line read them."""

#: activation types of the QDQ model
ONNX_ACTIVATIONS = ("int8", "uint8")
#: kind -> the suffix of each file the ONNX exporter writes under an output prefix
SUFFIXES = {"onnx_float": "_float.onnx", "onnx": "_quant.onnx"}
