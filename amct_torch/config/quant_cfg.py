"""quant.cfg (protobuf text, message ``AMCTConfig``): parse, then resolve per layer.

For each quantizable layer the whole ``CalibrationConfig`` of the highest-precedence source
applies (override_layer_configs > override_layer_types > common_config, missing parts from the
defaults); ``asymmetric`` cascades on its own; the deprecated conv_/fc_calibration_config apply
only when neither common_config nor override_layer_types is given. The full rules:
docs/config_and_record.md, "quant.cfg resolution"."""
from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Optional

import numpy as np

from amct_torch.caffe.quant_types import is_channel_wise, quantizable_types
from amct_torch.config.act_algos import DEFAULT, ActAlgorithm, by_proto_field
from amct_torch.config.layers import LayerInfo, quantizable_layers
from amct_torch.config.textproto import parse_text_proto, read_text_file
from amct_torch.config.types import LayerQuantConfig, QuantConfig
from amct_torch.errors import ConfigError
from amct_torch.proto import calibration_config_pb2

AMCTConfig = calibration_config_pb2.AMCTConfig


def proto_float(value: float) -> float:
    """The shortest decimal denoting the same float32 (what the user wrote, in practice)."""
    return float(np.format_float_positional(np.float32(value), unique=True, trim="0"))


def parse_quant_cfg(path: str) -> Any:
    """Read and parse a quant.cfg file into an ``AMCTConfig`` message (no model checks yet).

    Syntax errors raise ``ConfigError`` naming the file and line, with a suggestion for
    misspelled or split field names.
    """
    text = read_text_file(path, ConfigError, "quant.cfg")
    return parse_text_proto(text, AMCTConfig, path, ConfigError, "quant.cfg")


def parse_quant_cfg_text(text: str, path: str = "<quant.cfg>") -> Any:
    """``parse_quant_cfg`` for text already in memory (``path`` is used in messages)."""
    return parse_text_proto(text, AMCTConfig, path, ConfigError, "quant.cfg")


def _check_calibration(cc: Any, where: str, path: str, layer: Optional[str],
                       channel_wise_allowed: bool) -> None:
    """Validate one CalibrationConfig section; ``where`` names it in the message."""
    def fail(text: str) -> None:
        raise ConfigError(f"{where}: {text}", file=path, layer=layer)

    if cc.HasField("arq_quantize") and cc.arq_quantize.channel_wise and not channel_wise_allowed:
        fail("arq_quantize.channel_wise: true is only allowed for Convolution/Deconvolution "
             "(InnerProduct and Pooling are quantized per tensor); set channel_wise: false")
    algo = by_proto_field(cc.WhichOneof("acts_quant_algo"))
    if algo is None:
        return
    values = _proto_values(algo, getattr(cc, algo.proto_field))
    for f in algo.fields:
        err = f.check(f.name, values[f.name]) if f.check else None
        if err:
            fail(f"{algo.proto_field}.{err}")
    err = algo.check(values) if algo.check else None
    if err:
        fail(f"{algo.proto_field}: {err}")


def _proto_values(algo: ActAlgorithm, msg: Any) -> dict[str, Any]:
    """The algorithm's fields from its quant.cfg message (floats as the user wrote them)."""
    out: dict[str, Any] = {}
    for f in algo.fields:
        values = [getattr(msg, p) for p in f.proto]
        if f.kind == "integer":
            out[f.name] = int(values[0])
        elif f.kind == "range":
            out[f.name] = tuple(proto_float(v) for v in values)
        else:
            out[f.name] = proto_float(values[0])
    return out


def _asymmetric_of(cc: Any) -> Optional[bool]:
    algo = cc.WhichOneof("acts_quant_algo")
    if algo is not None and getattr(cc, algo).HasField("asymmetric"):
        return bool(getattr(cc, algo).asymmetric)
    return None


def _layer_config(cc: Optional[Any], layer: LayerInfo, asymmetric: bool) -> LayerQuantConfig:
    """Build the resolved config of ``layer`` from its chosen CalibrationConfig (or defaults)."""
    cw_default = is_channel_wise(layer.type)
    channel_wise = cw_default
    if cc is not None and cc.HasField("arq_quantize") and cc.arq_quantize.HasField("channel_wise"):
        channel_wise = bool(cc.arq_quantize.channel_wise) and cw_default
    algo = by_proto_field(cc.WhichOneof("acts_quant_algo")) if cc is not None else None
    if algo is None:  # no algorithm given: the default's message with the proto's defaults
        algo, msg = DEFAULT, getattr(calibration_config_pb2.CalibrationConfig(), DEFAULT.proto_field)
    else:
        msg = getattr(cc, algo.proto_field)
    return LayerQuantConfig(act_algo=algo.name, asymmetric=asymmetric, channel_wise=channel_wise,
                            **algo.layer_fields(_proto_values(algo, msg)))


def _repeated_check(items: Sequence[str], what: str, path: str) -> None:
    seen = set()
    for item in items:
        if item in seen:
            raise ConfigError(f"{what} '{item}' is given more than once", file=path)
        seen.add(item)


def _check_types(types: Sequence[str], field: str, all_types: set, path: str) -> None:
    for t in types:
        if t in quantizable_types():
            continue
        if t in all_types:
            raise ConfigError(f"{field}: layer type '{t}' is not quantizable (quantizable types: "
                              f"{', '.join(quantizable_types())})", file=path)
        raise ConfigError(f"{field}: unknown layer type '{t}': no layer of that type in the "
                          f"model (quantizable types: {', '.join(quantizable_types())})", file=path)


def _check_names(names: Sequence[str], field: str, by_name: dict, path: str,
                 need_quantizable: bool = True) -> None:
    for n in names:
        info = by_name.get(n)
        if info is None:
            raise ConfigError(f"{field}: unknown layer '{n}': the model has no layer of that name",
                              file=path, layer=n)
        if need_quantizable and not info.quantizable:
            raise ConfigError(f"{field}: layer '{n}' (type {info.type}) is not quantizable",
                              file=path, layer=n)


def resolve_quant_cfg(cfg: Any, layers: Sequence[LayerInfo], path: str) -> QuantConfig:
    """Validate ``cfg`` (an ``AMCTConfig``) against the model's ``layers`` and resolve the
    effective config of every quantizable layer (sorted by name; skipped layers get
    ``quant_enable=False``). Every problem raises ``ConfigError`` naming ``path``."""
    by_name = {info.name: info for info in layers}
    all_types = {info.type for info in layers}
    _check_global_lists(cfg, by_name, all_types, path)
    by_layer = _layer_overrides(cfg, by_name, path)
    by_type = _type_overrides(cfg, all_types, path)
    common = cfg.common_config if cfg.HasField("common_config") else None
    if common is not None:
        _check_calibration(common, "common_config", path, None, True)
    conv_cc, fc_cc = _deprecated_configs(cfg, common, path)
    result: dict[str, LayerQuantConfig] = {}
    for info in quantizable_layers(layers):
        deprecated_cc = conv_cc if is_channel_wise(info.type) else fc_cc
        sources = [by_layer.get(info.name), by_type.get(info.type), common, deprecated_cc]
        result[info.name] = _effective_config(cfg, info, [s for s in sources if s is not None])
    if not any(c.quant_enable for c in result.values()):
        raise ConfigError("nothing left to quantize: the model has no quantizable layer that is "
                          "not skipped (quantizable: Convolution, Deconvolution, InnerProduct, "
                          "AVE Pooling)", file=path)
    return QuantConfig(batch_num=int(cfg.batch_num), activation_offset=bool(cfg.activation_offset),
                       joint_quant=bool(cfg.joint_quant), do_fusion=bool(cfg.do_fusion),
                       skip_fusion_layers=list(dict.fromkeys(cfg.skip_fusion_layers)),
                       layers=result)


def _check_global_lists(cfg: Any, by_name: dict, all_types: set, path: str) -> None:
    """batch_num, and the skip and skip-fusion lists: no repeats, only the model's layers and
    (for the skips) quantizable ones."""
    if cfg.batch_num < 1:
        raise ConfigError(f"batch_num must be >= 1, got {cfg.batch_num}", file=path)
    _repeated_check(list(cfg.skip_layers), "skip_layers entry", path)
    _repeated_check(list(cfg.skip_layer_types), "skip_layer_types entry", path)
    _check_names(list(cfg.skip_layers), "skip_layers", by_name, path)
    _check_types(list(cfg.skip_layer_types), "skip_layer_types", all_types, path)
    _check_names(list(cfg.skip_fusion_layers), "skip_fusion_layers", by_name, path,
                 need_quantizable=False)


def _layer_overrides(cfg: Any, by_name: dict, path: str) -> dict[str, Any]:
    """``override_layer_configs`` checked, by layer name (each layer once, quantizable)."""
    by_layer: dict[str, Any] = {}
    for o in cfg.override_layer_configs:
        if o.layer_name in by_layer:
            raise ConfigError(f"override_layer_configs: layer '{o.layer_name}' is given more than "
                              "once", file=path, layer=o.layer_name)
        _check_names([o.layer_name], "override_layer_configs", by_name, path)
        info = by_name[o.layer_name]
        _check_calibration(o.calibration_config, "override_layer_configs", path, o.layer_name,
                           is_channel_wise(info.type))
        by_layer[o.layer_name] = o.calibration_config
    return by_layer


def _type_overrides(cfg: Any, all_types: set, path: str) -> dict[str, Any]:
    """``override_layer_types`` checked, by layer type (each type once, quantizable)."""
    by_type: dict[str, Any] = {}
    for o in cfg.override_layer_types:
        if o.layer_type in by_type:
            raise ConfigError(f"override_layer_types: layer type '{o.layer_type}' is given more "
                              "than once", file=path)
        _check_types([o.layer_type], "override_layer_types", all_types, path)
        _check_calibration(o.calibration_config, f"override_layer_types '{o.layer_type}'", path,
                           None, is_channel_wise(o.layer_type))
        by_type[o.layer_type] = o.calibration_config
    return by_type


def _deprecated_configs(cfg: Any, common: Any, path: str) -> tuple[Any, Any]:
    """The deprecated ``conv_calibration_config`` / ``fc_calibration_config`` (checked) when
    they apply — only without common_config and override_layer_types, else ignored with a
    warning; (None, None) when absent or ignored."""
    conv_cc = fc_cc = None
    deprecated = [n for n in ("conv_calibration_config", "fc_calibration_config")
                  if cfg.HasField(n)]
    if not deprecated:
        return conv_cc, fc_cc
    # stacklevel 3: the warning names the caller of resolve_quant_cfg
    if common is not None or len(cfg.override_layer_types) > 0:
        warnings.warn(f"{path}: {' and '.join(deprecated)} ignored: common_config or "
                      "override_layer_types is given (deprecated fields apply only without "
                      "them)", UserWarning, stacklevel=3)
        return conv_cc, fc_cc
    warnings.warn(f"{path}: {' and '.join(deprecated)} is deprecated; use common_config "
                  "and override_layer_types", DeprecationWarning, stacklevel=3)
    if cfg.HasField("conv_calibration_config"):
        conv_cc = cfg.conv_calibration_config
        _check_calibration(conv_cc, "conv_calibration_config", path, None, True)
    if cfg.HasField("fc_calibration_config"):
        fc_cc = cfg.fc_calibration_config
        _check_calibration(fc_cc, "fc_calibration_config", path, None, False)
    return conv_cc, fc_cc


def _effective_config(cfg: Any, info: LayerInfo, sources: list) -> LayerQuantConfig:
    """A layer's config from the first of its ``sources`` (layer override, type override,
    common, deprecated; asymmetric from the first that says, else activation_offset),
    disabled when the layer or its type is skipped."""
    asym = next((a for a in map(_asymmetric_of, sources) if a is not None),
                bool(cfg.activation_offset))
    lqc = _layer_config(sources[0] if sources else None, info, asym)
    if info.name in cfg.skip_layers or info.type in cfg.skip_layer_types:
        lqc = replace(lqc, quant_enable=False)
    return lqc
