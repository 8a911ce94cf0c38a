"""``create_quant_config``: AMCT's call that writes the JSON quant config for a Caffe model.

Only the layer list of the model is needed (names, types, the params that decide
quantizability), so the deploy prototxt is parsed without building the torch graph; the
weights file is only checked to exist, as AMCT does.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Optional

from amct_torch.arguments import checked, opt, path_arg
from amct_torch.caffe.netio import parse_prototxt
from amct_torch.config.json_config import write_quant_config_json
from amct_torch.config.layers import LayerInfo, layer_infos_from_net
from amct_torch.config.quant_cfg import parse_quant_cfg, resolve_quant_cfg
from amct_torch.config.types import QuantConfig
from amct_torch.errors import ConfigError, ModelError
from amct_torch.proto import calibration_config_pb2


def model_layer_infos(model_file: str) -> list[LayerInfo]:
    """``LayerInfo`` of every layer of a deploy prototxt."""
    return layer_infos_from_net(parse_prototxt(model_file))


def default_quant_config(layers: Sequence[LayerInfo], skip_layers: Optional[Sequence[str]] = None,
                         batch_num: int = 1, activation_offset: bool = True,
                         path: str = "<arguments>") -> QuantConfig:
    """The config ``create_quant_config`` writes without a quant.cfg: defaults everywhere, the
    given layers skipped. Validated exactly like a quant.cfg with those three fields."""
    if isinstance(batch_num, bool) or not isinstance(batch_num, int) or batch_num < 1:
        raise ConfigError(f"batch_num must be an integer >= 1, got {batch_num!r}", file=path)
    if not isinstance(activation_offset, bool):
        raise ConfigError(f"activation_offset must be True or False, got {activation_offset!r}",
                          file=path)
    if isinstance(skip_layers, str):
        raise ConfigError("skip_layers must be a list of layer names, not a string", file=path)
    cfg = calibration_config_pb2.AMCTConfig(batch_num=batch_num,
                                            activation_offset=activation_offset)
    cfg.skip_layers.extend(list(skip_layers or []))
    return resolve_quant_cfg(cfg, layers, path)


@checked(config_file=path_arg, model_file=path_arg, weights_file=path_arg, config_defination=opt(path_arg))
def create_quant_config(config_file: str, model_file: str, weights_file: str,
                        skip_layers: Optional[Sequence[str]] = None, batch_num: int = 1,
                        activation_offset: bool = True,
                        config_defination: Optional[str] = None) -> None:
    """Write the JSON quant config (docs/config_and_record.md) of the Caffe model to ``config_file``.

    With ``config_defination`` (a quant.cfg) that file decides everything and ``skip_layers``,
    ``batch_num`` and ``activation_offset`` are ignored, as in AMCT. The file is written
    atomically.
    """
    from amct_torch.files.transaction import check_outputs, make_folder
    from amct_torch.inputs.limits import check_regular_file
    check_regular_file(weights_file, "weights file", ModelError)
    check_outputs([config_file], [model_file, weights_file, config_defination])
    layers = model_layer_infos(model_file)
    if config_defination is not None:
        qc = resolve_quant_cfg(parse_quant_cfg(config_defination), layers, config_defination)
    else:
        qc = default_quant_config(layers, skip_layers, batch_num, activation_offset, model_file)
    make_folder(os.path.dirname(os.path.abspath(config_file)))
    write_quant_config_json(config_file, qc)
