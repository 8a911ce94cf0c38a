"""Quantization configuration: quant.cfg (protobuf text) and the JSON quant config.

Both are resolved into one form, ``QuantConfig`` (global settings + a ``LayerQuantConfig`` per
quantizable layer), validated against the model's ``LayerInfo`` list.
"""
from amct_torch.config.create import create_quant_config, default_quant_config, model_layer_infos
from amct_torch.config.json_config import (
    parse_quant_config_json,
    quant_config_to_json,
    read_quant_config_json,
    write_quant_config_json,
)
from amct_torch.config.layers import LayerInfo, layer_infos_from_net
from amct_torch.config.quant_cfg import parse_quant_cfg, parse_quant_cfg_text, resolve_quant_cfg
from amct_torch.config.types import LayerQuantConfig, QuantConfig

__all__ = ["LayerInfo", "LayerQuantConfig", "QuantConfig", "create_quant_config",
           "default_quant_config", "layer_infos_from_net", "model_layer_infos",
           "parse_quant_cfg", "parse_quant_cfg_text", "parse_quant_config_json",
           "quant_config_to_json", "read_quant_config_json", "resolve_quant_cfg",
           "write_quant_config_json"]
