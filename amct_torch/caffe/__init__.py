"""Caffe models in torch: read/write Caffe files, Caffe-exact layer modules, the graph builder.

Names are imported on first use (module ``__getattr__``), so that the file readers
(``netio``, ``stream_reader``) import without torch: the command reads the caffemodel on a
helper thread while the main thread is still importing torch (``read_ahead``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from amct_torch.runtime.lazy_names import lazy_names

#: name -> the module that defines it
_LAZY = {
    **{n: "amct_torch.caffe.graph" for n in ("CaffeGraphModule", "build_graph", "layer_modules", "load_caffe")},
    **{n: "amct_torch.caffe.layers" for n in ("CaffeLayer", "is_quantizable", "layer_class", "supported_types")},
    "mark_integer_quants": "amct_torch.caffe.layers.quant",
    "KNOWN_PYTHON": "amct_torch.caffe.layers.rcnn",
    "is_net_head": "amct_torch.caffe.layers.traits",
    "refuse_quantized_duplicates": "amct_torch.caffe.duplicate_names",
    **{n: "amct_torch.caffe.netio" for n in ("ParsedNet", "read_net", "save_caffe", "write_net")},
    **{n: "amct_torch.caffe.unknown_fields" for n in ("allow_unknown_fields", "unknown_fields_allowed")},
}

__all__ = ["KNOWN_PYTHON", "CaffeGraphModule", "CaffeLayer", "ParsedNet", "allow_unknown_fields", "build_graph",
           "is_net_head", "is_quantizable", "layer_class", "layer_modules", "load_caffe", "mark_integer_quants",
           "read_net", "refuse_quantized_duplicates", "save_caffe", "supported_types", "unknown_fields_allowed",
           "write_net"]


__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())


if TYPE_CHECKING:  # static analysers and IDEs see the real names
    from amct_torch.caffe.duplicate_names import refuse_quantized_duplicates
    from amct_torch.caffe.graph import CaffeGraphModule, build_graph, layer_modules, load_caffe
    from amct_torch.caffe.layers import CaffeLayer, is_quantizable, layer_class, supported_types
    from amct_torch.caffe.layers.quant import mark_integer_quants
    from amct_torch.caffe.layers.rcnn import KNOWN_PYTHON
    from amct_torch.caffe.layers.traits import is_net_head
    from amct_torch.caffe.netio import ParsedNet, read_net, save_caffe, write_net
    from amct_torch.caffe.unknown_fields import allow_unknown_fields, unknown_fields_allowed
