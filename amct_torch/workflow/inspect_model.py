"""``amct-torch inspect MODEL [WEIGHTS]``: what a user asks first about a Caffe model, in about a
second and without data.

Why: before choosing data and waiting for a calibration, a user wants to know whether the tool
handles the model: its inputs and shapes, layer types, the layers the config quantizes, every
layer the loader does not support (all of them), every prototxt field it does not read, and
whether the ONNX export will work (``export/onnx/preflight.py``). Exit 0: supported; 2: a file
cannot be read; 3: something is not supported. docs/cli.md."""
from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

EXIT_OK = 0
EXIT_UNSUPPORTED = 3


@dataclass
class Unsupported:
    """One layer the tool cannot handle, and why (in words)."""

    layer: str
    type: str
    reason: str


@dataclass
class Inspection:
    """The answers, as ``inspect`` prints them (``format``) or as JSON (``to_json``)."""

    model_file: str
    weights_file: Optional[str]
    config: str
    inputs: list[tuple[str, Optional[list[int]]]]
    layer_types: dict[str, int]
    quantizable: list[str]
    quantized: list[str]
    unsupported: list[Unsupported] = field(default_factory=list)
    unknown_fields: list[Any] = field(default_factory=list)  # UnknownField
    ort_float: list[tuple[str, str]] = field(default_factory=list)  # (layer, why)
    allow_unknown_fields: bool = False
    outputs: list[tuple[str, Optional[list[int]]]] = field(default_factory=list)
    onnx_ok: Optional[bool] = None
    onnx_message: str = ""
    seconds: float = 0.0
    #: a train/test net's data layers (data sources) and metric/loss layers (never quantized)
    data_layers: list[tuple[str, str, list[str]]] = field(default_factory=list)
    head_layers: list[tuple[str, str]] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        refused = bool(self.unknown_fields) and not self.allow_unknown_fields
        return EXIT_UNSUPPORTED if self.unsupported or refused or self.onnx_ok is False else EXIT_OK

    def to_json(self) -> dict:
        """Plain types only (lists, dicts, strings, numbers, booleans, null)."""
        return {
            "model": self.model_file, "weights": self.weights_file, "config": self.config,
            "inputs": [{"name": n, "shape": s} for n, s in self.inputs],
            "outputs": [{"name": n, "shape": s} for n, s in self.outputs],
            "layers": sum(self.layer_types.values()), "layer_types": dict(self.layer_types),
            "quantizable": list(self.quantizable), "quantized": list(self.quantized),
            "unsupported": [asdict(u) for u in self.unsupported],
            "unknown_fields": [{"layer": f.layer, "field": f.where(), "text": f.text}
                               for f in self.unknown_fields],
            "onnx": {"ok": self.onnx_ok, "message": self.onnx_message,
                     "float_in_onnxruntime": [{"layer": n, "why": w} for n, w in self.ort_float]},
            "data_layers": [{"layer": n, "type": t, "tops": tops} for n, t, tops in self.data_layers],
            "metric_loss_layers": [{"layer": n, "type": t} for n, t in self.head_layers],
            "supported": self.exit_code == EXIT_OK, "exit_code": self.exit_code,
            "seconds": round(self.seconds, 3),
        }

    def format(self) -> str:
        """The plain-text answer, one topic per line (long lists wrapped)."""
        def shape(s: Optional[list[int]]) -> str:
            return "[?]" if s is None else "[" + ", ".join(str(d) for d in s) + "]"

        lines = [f"model        {self.model_file}",
                 f"weights      {self.weights_file or 'none (zeros: structure and shapes only)'}"]
        lines.append("inputs       " + ("; ".join(f"{n} {shape(s)}" for n, s in self.inputs) or "none"))
        if self.outputs:
            lines.append("outputs      " + "; ".join(f"{n} {shape(s)}" for n, s in self.outputs))
        types = ", ".join(f"{t} {c}" for t, c in self.layer_types.items())
        lines.append(f"layers       {sum(self.layer_types.values())}: {types}")
        skipped = [n for n in self.quantizable if n not in set(self.quantized)]
        lines.append(f"quantized    {len(self.quantized)} of {len(self.quantizable)} quantizable layers "
                     f"({self.config})" + (": " + ", ".join(self.quantized) if self.quantized else ""))
        if skipped:
            lines.append(f"not quantized {', '.join(skipped)}")
        if self.data_layers:
            lines.append("data         " + "; ".join(f"{n} ({t}): {', '.join(tops)}"
                                                     for n, t, tops in self.data_layers))
        if self.head_layers:
            lines.append("metric/loss  " + ", ".join(f"{n} ({t})" for n, t in self.head_layers)
                         + ": run in torch, not quantized")
        if self.unsupported:
            lines.append(f"unsupported  {len(self.unsupported)} layer(s):")
            lines += [f"  layer '{u.layer}' (type {u.type}): {u.reason}" for u in self.unsupported]
        else:
            lines.append("unsupported  none")
        if self.unknown_fields:
            how = ("allowed: those layers run without them" if self.allow_unknown_fields else
                   "not read, the numbers may differ; refused unless --allow-unknown-fields")
            lines.append(f"unknown fields {len(self.unknown_fields)} ({how}):")
            lines += [f"  {'layer ' + repr(f.layer) if f.layer else 'the net'}: {f.where()} "
                      f"({' '.join(f.text.split())[:80]})" for f in self.unknown_fields]
        verdict = {True: "will work", False: "will fail", None: "not checked"}[self.onnx_ok]
        lines.append(f"ONNX export  {verdict}: {self.onnx_message}")
        if self.ort_float:
            lines.append(f"ORT float    {len(self.ort_float)} quantized layer(s) ONNX Runtime runs in float:")
            lines += [f"  layer '{n}': {w}" for n, w in self.ort_float]
        lines.append(f"result       {'supported' if self.exit_code == EXIT_OK else 'NOT supported'} "
                     f"(exit {self.exit_code}; {self.seconds:.2f} s)")
        return "\n".join(_wrap(line) for line in lines)


def _wrap(line: str, width: int = 100) -> str:
    """A long line wrapped at spaces, its own indentation kept, the continuation lines indented
    under the value (the text after the label's run of two or more spaces; else two more than
    the line's own indentation)."""
    if len(line) <= width:
        return line
    import re
    import textwrap
    label = re.match(r"^\s*\S.*?\s{2,}(?=\S)", line)
    own = len(line) - len(line.lstrip(" "))
    column = len(label.group(0)) if label and len(label.group(0)) < width // 2 else own + 2
    return textwrap.fill(line, width=width, subsequent_indent=" " * column, break_long_words=False,
                         break_on_hyphens=False, replace_whitespace=False)


def _unsupported(parsed: Any) -> list[Unsupported]:
    """Every layer whose type the loader lacks, and every Python layer it does not know."""
    from amct_torch.caffe import KNOWN_PYTHON, layer_class
    known_python: set[tuple[str, str]] = KNOWN_PYTHON
    known = ", ".join(f"{m}.{c}" for m, c in sorted(known_python)) or "none"
    out = []
    for layer in parsed.layers:
        if layer_class(layer.type) is None:
            out.append(Unsupported(layer.name, layer.type, "unknown layer type"))
        elif layer.type == "Python":
            p = layer.python_param
            if (p.module, p.layer) not in known_python:
                out.append(Unsupported(layer.name, layer.type,
                                       f"Python layer (module '{p.module}', class '{p.layer}') runs code "
                                       f"that is not in the model files; known Python layers: {known}"))
    return out


def _shared_names(parsed: Any, quantized: list[str]) -> list[Unsupported]:
    """A quantized layer whose name another layer has (the record could not tell them apart)."""
    from amct_torch.caffe import refuse_quantized_duplicates
    from amct_torch.errors import ModelError
    out = []
    for layer in parsed.net.layer:
        try:
            refuse_quantized_duplicates(parsed.net.layer, [layer.name] if layer.name in quantized else [], None)
        except ModelError as err:
            out.append(Unsupported(str(err.layer), layer.type, err.message))
    return out


def _is_head(type_name: str) -> bool:
    from amct_torch.caffe import is_net_head
    return is_net_head(type_name)


def _config(path: Optional[str], infos: list, model_file: str) -> Any:
    """The QuantConfig: defaults, or the user's quant.cfg / JSON config."""
    from amct_torch.config import default_quant_config, parse_quant_cfg, read_quant_config_json, resolve_quant_cfg
    from amct_torch.errors import ConfigError
    if path is None:
        return default_quant_config(infos, path=model_file)
    if not os.path.isfile(path):
        raise ConfigError("quant config not found", file=path)
    if path.lower().endswith(".json"):
        return read_quant_config_json(path, infos)
    return resolve_quant_cfg(parse_quant_cfg(path), infos, path)


def _outputs(gm: Any) -> list[tuple[str, Optional[list[int]]]]:
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    res = []
    for name, node in dict(out_node.args[0]).items():
        s = node.meta.get("caffe_shape")
        res.append((name, None if s is None else [int(d) for d in s]))
    return res


def inspect_model(model_file: str, weights_file: Optional[str] = None,
                  config: Optional[str] = None, onnx: bool = True,
                  allow_unknown_fields: bool = False) -> Inspection:
    """Read the model (and weights), list its types and unsupported layers, resolve the quant
    config and (``onnx``, when the graph loads) run the ONNX preflight. A file that cannot be
    read raises its AmctError; anything unsupported (unknown fields too, unless
    ``allow_unknown_fields``) is reported in the result."""
    from amct_torch.caffe import read_net

    # the function shares its module's name, so the package cannot give it (see test_front_doors.py)
    from amct_torch.caffe.unknown_fields import unknown_fields
    from amct_torch.config import layer_infos_from_net
    t0 = time.perf_counter()
    parsed = read_net(os.fspath(model_file), None if weights_file is None else os.fspath(weights_file))
    infos = layer_infos_from_net(parsed.net)
    qc = _config(config, infos, model_file)
    res = Inspection(
        model_file=model_file, weights_file=weights_file,
        config="default config" if config is None else f"config {config}",
        inputs=[(n, None if not s else [int(d) for d in s]) for n, s in parsed.inputs],
        layer_types=dict(Counter(layer.type for layer in parsed.layers).most_common()),
        quantizable=sorted(i.name for i in infos if i.quantizable),
        quantized=sorted(qc.enabled_layers()),
        unsupported=_unsupported(parsed) + _shared_names(parsed, qc.enabled_layers()),
        unknown_fields=unknown_fields(parsed.net),
        allow_unknown_fields=allow_unknown_fields)
    res.data_layers = [(l.name, l.type, list(l.top)) for l in parsed.data_layers]
    res.head_layers = [(l.name, l.type) for l in parsed.layers if _is_head(l.type)]
    if res.unsupported:
        res.onnx_message = "the model has unsupported layers"
    else:
        from amct_torch.caffe import build_graph, mark_integer_quants
        from amct_torch.errors import ModelError
        try:
            gm = build_graph(parsed, allow_unknown_fields=True)  # listed above
        except ModelError:
            if weights_file is not None or not any(not s for _, s in parsed.inputs):
                raise
            # a train/test net whose data cannot be read here: its input shapes are unknown
            res.onnx_message = ("not checked: the data layers' sources cannot be read, so the "
                                "input shapes are unknown without weights")
            res.seconds = time.perf_counter() - t0
            return res
        mark_integer_quants(gm)
        res.outputs = _outputs(gm)
        from amct_torch.export import ort_float_layers
        res.ort_float = ort_float_layers(gm, {n: bool(qc.layers[n].channel_wise) for n in qc.enabled_layers()
                                              if n in qc.layers})
        if onnx:
            _onnx_answer(res, gm, qc, model_file)
        else:
            res.onnx_message = "skipped (--no-onnx)"
    res.seconds = time.perf_counter() - t0
    return res


def _onnx_answer(res: Inspection, gm: Any, qc: Any, model_file: str) -> None:
    from amct_torch.errors import ExportError
    try:
        from amct_torch.export import preflight_onnx
    except ImportError as err:  # the onnx package itself is missing
        res.onnx_ok, res.onnx_message = False, f"cannot check: {err}"
        return
    try:
        pre = preflight_onnx(gm, qc, model_file=model_file)
    except ExportError as err:
        res.onnx_ok = False
        res.onnx_message = err.message + (f" (layer '{err.layer}')" if err.layer else "")
        return
    res.onnx_ok = True
    res.onnx_message = (f"float model {pre.float_nodes} nodes, QDQ model {pre.quant_nodes} nodes, "
                        f"{pre.quantized} quantized layers; checked with {pre.checked_with}")
