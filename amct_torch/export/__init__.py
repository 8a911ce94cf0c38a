"""The output models: fake-quant and deploy Caffe, quant info JSON, ONNX QDQ, convert_model.
See docs/export.md."""
from amct_torch.export.caffe.deploy import deploy_net, pack_deq_scale, save_deploy, unpack_deq_scale
from amct_torch.export.caffe.fakequant import fake_quant_graph, fake_quant_net, save_fake_quant
from amct_torch.export.convert import convert_model, refuse_quantized_model, save_quant_models
from amct_torch.export.quant_info import quant_info, write_quant_info


def export_onnx(*args, **kwargs):
    """``amct_torch.export.onnx.qdq.export_onnx`` (same arguments, see there), imported on first
    call: the ``onnx`` package costs ~0.5 s to import and most jobs write no ONNX model."""
    from amct_torch.export.onnx.qdq import export_onnx as impl
    return impl(*args, **kwargs)


__all__ = ["convert_model", "deploy_net", "export_onnx", "fake_quant_graph", "fake_quant_net",
           "pack_deq_scale", "quant_info", "refuse_quantized_model", "save_deploy",
           "save_fake_quant", "save_quant_models", "unpack_deq_scale", "write_quant_info"]
