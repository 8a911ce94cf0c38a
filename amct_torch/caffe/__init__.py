"""Caffe models in torch: read/write Caffe files, Caffe-exact layer modules, the graph builder."""
from amct_torch.caffe.graph import CaffeGraphModule, build_graph, layer_modules, load_caffe
from amct_torch.caffe.layers import CaffeLayer, is_quantizable, supported_types
from amct_torch.caffe.netio import ParsedNet, read_net, save_caffe, write_net

__all__ = ["CaffeGraphModule", "CaffeLayer", "ParsedNet", "build_graph", "is_quantizable",
           "layer_modules", "load_caffe", "read_net", "save_caffe", "supported_types", "write_net"]
