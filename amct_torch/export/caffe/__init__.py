"""The Caffe output models: the fake-quant net, the deploy net (int8 weights, int32 bias) and
the graph → NetParameter builder with AMCT's Quant/DeQuant layers. See docs/export.md."""
