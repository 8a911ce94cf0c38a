"""The scale/offset record file (protobuf text ``ScaleOffsetRecord``, seed 000): read, write,
atomic merge of weight and activation factors, validation against the model."""
from amct_torch.record.io import (empty_record, format_record, merge_activation,
                                  merge_activation_factors, parse_record_text, read_record,
                                  write_record, write_weight_factors)
from amct_torch.record.types import LayerRecord
from amct_torch.record.validate import validate_layer_record, validate_record

__all__ = ["LayerRecord", "empty_record", "format_record",
           "merge_activation", "merge_activation_factors", "parse_record_text", "read_record",
           "validate_layer_record", "validate_record", "write_record", "write_weight_factors"]
