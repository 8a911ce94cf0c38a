"""The JSON quant config (docs/config_and_record.md): the file ``create_quant_config`` writes and ``init``
reads. Writing is atomic; reading validates everything a user may have edited by hand
(duplicate keys, unknown layers and parameters, wrong types, out-of-range values) and names the
file, the layer and the field in every error."""
from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any, NoReturn, Optional, cast

from amct_torch.caffe.quant_types import is_channel_wise
from amct_torch.config.act_algos import ACT_ALGORITHMS, DEFAULT, Field
from amct_torch.config.layers import LayerInfo, quantizable_layers
from amct_torch.config.types import (
    JSON_VERSION,
    NUM_BITS,
    WTS_ALGO,
    LayerQuantConfig,
    QuantConfig,
)
from amct_torch.errors import ConfigError
from amct_torch.files.atomic import atomic_write_text

GLOBAL_KEYS = ("version", "batch_num", "activation_offset", "joint_quant", "do_fusion",
               "skip_fusion_layers")
_LAYER_KEYS = ("quant_enable", "activation_quant_params", "weight_quant_params")
_ACT_COMMON = ("num_bits", "act_algo", "asymmetric")
_WTS_KEYS = ("num_bits", "wts_algo", "channel_wise")


def layer_config_to_json(c: LayerQuantConfig) -> dict:
    """The JSON object of one layer (key order as in docs/config_and_record.md, "JSON quant config")."""
    act: dict[str, Any] = {"num_bits": c.num_bits, "act_algo": c.act_algo}
    for f in ACT_ALGORITHMS[c.act_algo].fields:
        v = getattr(c, f.name)
        act[f.name] = (list(v) if v else None) if f.kind == "range" else v
    act["asymmetric"] = c.asymmetric
    return {"quant_enable": c.quant_enable, "activation_quant_params": act,
            "weight_quant_params": {"num_bits": c.num_bits, "wts_algo": c.wts_algo,
                                    "channel_wise": c.channel_wise}}


def quant_config_to_json(qc: QuantConfig) -> dict:
    """Global keys first, then one object per quantizable layer sorted by name."""
    out: dict[str, Any] = {"version": qc.version, "batch_num": qc.batch_num,
                           "activation_offset": qc.activation_offset,
                           "joint_quant": qc.joint_quant, "do_fusion": qc.do_fusion,
                           "skip_fusion_layers": list(qc.skip_fusion_layers)}
    for name in sorted(qc.layers):
        out[name] = layer_config_to_json(qc.layers[name])
    return out


def write_quant_config_json(path: str, qc: QuantConfig) -> None:
    """Write ``qc`` as the JSON quant config, atomically (temp file + rename)."""
    atomic_write_text(path, json.dumps(quant_config_to_json(qc), indent=4) + "\n")


class _Obj(dict):
    """A JSON object that remembers keys it saw twice (reported with their location later)."""

    duplicates: list

    @classmethod
    def from_pairs(cls, pairs: list) -> _Obj:
        obj = cls()
        obj.duplicates = []
        for k, v in pairs:
            if k in obj:
                obj.duplicates.append(k)
            obj[k] = v
        return obj


class _Reader:
    """Validation of one JSON config against the model's layers."""

    def __init__(self, path: str, layers: Sequence[LayerInfo]) -> None:
        self.path = path
        self.by_name = {l.name: l for l in layers}
        self.quantizable = quantizable_layers(layers)

    def fail(self, text: str, layer: Optional[str] = None) -> NoReturn:
        raise ConfigError(text, file=self.path, layer=layer)

    def obj(self, value: Any, where: str, layer: Optional[str] = None) -> _Obj:
        if not isinstance(value, dict):
            self.fail(f"{where} must be a JSON object, got {_kind(value)}", layer)
        duplicates = getattr(value, "duplicates", None)
        if duplicates:
            self.fail(f"duplicate key '{duplicates[0]}' in {where}", layer)
        return cast(_Obj, value)

    def known(self, obj: dict, allowed: Sequence[str], where: str, layer: Optional[str]) -> None:
        for k in obj:
            if k not in allowed:
                self.fail(f"unknown parameter '{k}' in {where} (allowed: {', '.join(allowed)})",
                          layer)

    def boolean(self, obj: dict, key: str, default: bool, where: str,
                layer: Optional[str] = None) -> bool:
        v = obj.get(key, default)
        if not isinstance(v, bool):
            self.fail(f"{where}{key} must be true or false, got {json.dumps(v)}", layer)
        return v

    def integer(self, obj: dict, key: str, default: int, where: str,
                layer: Optional[str] = None) -> int:
        v = obj.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int):
            self.fail(f"{where}{key} must be an integer, got {json.dumps(v)}", layer)
        return v

    def number(self, obj: dict, key: str, default: float, where: str, layer: str) -> float:
        v = obj.get(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            self.fail(f"{where}{key} must be a finite number, got {json.dumps(v)}", layer)
        return float(v)

    def read_globals(self, doc: dict) -> QuantConfig:
        version = self.integer(doc, "version", JSON_VERSION, "")
        if version != JSON_VERSION:
            self.fail(f"version must be {JSON_VERSION}, got {version}")
        batch_num = self.integer(doc, "batch_num", 1, "")
        if batch_num < 1:
            self.fail(f"batch_num must be >= 1, got {batch_num}")
        sfl = doc.get("skip_fusion_layers", [])
        if not isinstance(sfl, list) or not all(isinstance(s, str) for s in sfl):
            self.fail(f"skip_fusion_layers must be a list of layer names, got {json.dumps(sfl)}")
        for name in sfl:
            if name not in self.by_name:
                self.fail(f"skip_fusion_layers: unknown layer '{name}': the model has no layer of "
                          "that name", name)
        return QuantConfig(version=version, batch_num=batch_num,
                           activation_offset=self.boolean(doc, "activation_offset", True, ""),
                           joint_quant=self.boolean(doc, "joint_quant", False, ""),
                           do_fusion=self.boolean(doc, "do_fusion", True, ""),
                           skip_fusion_layers=list(sfl))

    def read_layer(self, value: Any, info: LayerInfo, activation_offset: bool) -> LayerQuantConfig:
        name = info.name
        obj = self.obj(value, "the layer object", name)
        self.known(obj, _LAYER_KEYS, "the layer object", name)
        enable = self.boolean(obj, "quant_enable", True, "", name)
        act = self.obj(obj.get("activation_quant_params", _Obj.from_pairs([])),
                       "activation_quant_params", name)
        wts = self.obj(obj.get("weight_quant_params", _Obj.from_pairs([])),
                       "weight_quant_params", name)
        a, w = "activation_quant_params.", "weight_quant_params."
        algo_name = act.get("act_algo", DEFAULT.name)
        algo = ACT_ALGORITHMS.get(algo_name) if isinstance(algo_name, str) else None
        if algo is None:
            self.fail(f"{a}act_algo must be one of {', '.join(ACT_ALGORITHMS)}, got "
                      f"{json.dumps(algo_name)}", name)
        allowed = _ACT_COMMON + tuple(f.name for f in algo.fields)
        self.known(act, allowed, f"activation_quant_params ({algo.name})", name)
        self.known(wts, _WTS_KEYS, "weight_quant_params", name)
        for where, params in ((a, act), (w, wts)):
            bits = self.integer(params, "num_bits", NUM_BITS, where, name)
            if bits != NUM_BITS:
                self.fail(f"{where}num_bits must be {NUM_BITS}, got {bits}", name)
        if wts.get("wts_algo", WTS_ALGO) != WTS_ALGO:
            self.fail(f"{w}wts_algo must be \"{WTS_ALGO}\", got {json.dumps(wts['wts_algo'])}", name)
        cw_ok = is_channel_wise(info.type)
        channel_wise = self.boolean(wts, "channel_wise", cw_ok, w, name)
        if channel_wise and not cw_ok:
            self.fail(f"{w}channel_wise: true is only allowed for Convolution/Deconvolution, "
                      f"layer type is {info.type}", name)
        asym = self.boolean(act, "asymmetric", activation_offset, a, name)
        values = {f.name: self.act_field(act, f, a, name) for f in algo.fields}
        err = algo.check(values) if algo.check else None
        if err:
            self.fail(a + err, name)
        return LayerQuantConfig(quant_enable=enable, act_algo=algo.name, asymmetric=asym,
                                channel_wise=channel_wise, **algo.layer_fields(values))

    def act_field(self, act: dict, f: Field, where: str, layer: str) -> Any:
        """One field of the layer's activation algorithm: read (its default when absent),
        type-checked and range-checked."""
        if f.kind == "integer":
            v: Any = self.integer(act, f.name, f.default, where, layer)
        elif f.kind == "number":
            v = self.number(act, f.name, f.default, where, layer)
        else:
            rng = act.get(f.name, list(f.default))
            if not (isinstance(rng, list) and len(rng) == 2 and all(
                    isinstance(x, (int, float)) and not isinstance(x, bool) for x in rng)):
                self.fail(f"{where}{f.name} must be a list of two numbers [start, end], got "
                          f"{json.dumps(rng)}", layer)
            v = (float(rng[0]), float(rng[1]))
        err = f.check(f.name, v) if f.check else None
        if err:
            self.fail(where + err, layer)
        return v

    def read(self, doc: Any) -> QuantConfig:
        doc = self.obj(doc, "the top level")
        qc = self.read_globals(doc)
        quantizable = {l.name for l in self.quantizable}
        for key in doc:
            if key in GLOBAL_KEYS or key in quantizable:
                continue
            info = self.by_name.get(key)
            if info is not None:
                self.fail(f"layer '{key}' (type {info.type}) is not quantizable", key)
            self.fail(f"unknown layer or parameter '{key}': the model has no layer of that name "
                      f"and it is not one of the global keys ({', '.join(GLOBAL_KEYS)})", key)
        for info in self.quantizable:
            if info.name in doc:
                qc.layers[info.name] = self.read_layer(doc[info.name], info, qc.activation_offset)
            else:  # a layer the user deleted from the file is not quantized
                qc.layers[info.name] = LayerQuantConfig(
                    quant_enable=False, asymmetric=qc.activation_offset,
                    channel_wise=is_channel_wise(info.type))
        if not qc.enabled_layers():
            self.fail("nothing to quantize: no layer has \"quant_enable\": true")
        return qc


def _kind(v: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(v), "a number")


def parse_quant_config_json(text: str, layers: Sequence[LayerInfo], path: str) -> QuantConfig:
    """Parse and validate JSON config ``text`` (``path`` is used in messages)."""
    try:
        doc = json.loads(text, object_pairs_hook=_Obj.from_pairs)
    except json.JSONDecodeError as err:
        raise ConfigError(f"not valid JSON: {err.msg} (column {err.colno})", file=path,
                          line=err.lineno) from None
    except RecursionError:
        raise ConfigError("not valid JSON: nested too deeply", file=path) from None
    except (ValueError, OverflowError) as err:  # e.g. an integer of thousands of digits
        raise ConfigError(f"not a usable JSON number: {err}", file=path) from None
    return _Reader(path, layers).read(doc)


def read_quant_config_json(path: str, layers: Sequence[LayerInfo]) -> QuantConfig:
    """Read the JSON quant config at ``path`` and validate it against the model's ``layers``."""
    from amct_torch.config.textproto import read_text_file
    return parse_quant_config_json(read_text_file(path, ConfigError, "JSON quant config"),
                                   layers, path)
