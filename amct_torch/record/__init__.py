"""The scale/offset record (protobuf text ``ScaleOffsetRecord``): the in-memory
``{layer: LayerRecord}``, merging weight and activation factors into it, reading and
writing the file (atomically), validation against the model."""
from amct_torch.record.io import (
    as_stored,
    empty_record,
    format_record,
    merge_activation_factors,
    parse_record_text,
    read_record,
    write_record,
    write_weight_factors,
)
from amct_torch.record.merge import add_activation_factors, add_weight_factors
from amct_torch.record.types import LayerRecord
from amct_torch.record.validate import validate_layer_record, validate_record

__all__ = ["LayerRecord", "add_activation_factors", "add_weight_factors", "as_stored",
           "empty_record", "format_record", "merge_activation_factors", "parse_record_text",
           "read_record", "validate_layer_record", "validate_record", "write_record",
           "write_weight_factors"]
