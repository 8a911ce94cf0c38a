"""``accuracy_based_auto_calibration``: AMCT's accuracy-driven search of which layers to leave in
float.

Why: when the int8 model misses the user's accuracy target, AMCT calibrates once, ranks the
quantized layers by how much quantization disturbs their output (cosine similarity), and
binary-searches how many of the worst must stay float. Activation factors come from the float
model, so one calibration serves every candidate. Same name, arguments and evaluator methods as
``amct_caffe``, except that the evaluator receives torch modules (taking the net inputs in
Caffe's order, returning ``{output blob: tensor}``) instead of file paths."""
from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

import torch
from torch import fx, nn

from amct_torch.arguments import checked, path_arg
from amct_torch.errors import AmctError, ArgumentError, CalibrationError

log = logging.getLogger("amct_torch")

__all__ = ["AutoCalibrationEvaluatorBase", "BinarySearchStrategy", "CosineSimilaritySensitivity",
           "AutoCalibrationResult", "accuracy_based_auto_calibration"]


class AutoCalibrationEvaluatorBase:
    """What the user implements (AMCT's ``AutoCalibrationEvaluatorBase``).

    ``calibration(model)``: run ``batch_num`` calibration batches through ``model`` (the float
    model with calibration hooks, as returned by ``quantize_model``).
    ``evaluate(model) -> float``: the metric of ``model`` on the user's validation data.
    ``metric_eval(original_metric, new_metric) -> (passes, loss)``: whether the quantized
    model's metric is good enough compared with the float one.
    Optional attribute ``device``: where the models are put (default cpu)."""

    def calibration(self, model: nn.Module) -> None:
        raise NotImplementedError

    def evaluate(self, model: nn.Module) -> float:
        raise NotImplementedError

    def metric_eval(self, original_metric: float, new_metric: float) -> tuple[bool, float]:
        raise NotImplementedError


class BinarySearchStrategy:
    """Fewest layers to leave in float: the smallest ``k`` in ``[1, n]`` with ``passes(k)``,
    assuming that skipping more of the worst layers never hurts (AMCT's assumption)."""

    def search(self, n: int, passes: Callable[[int], bool]) -> int:
        lo, hi = 1, n
        while lo < hi:
            mid = (lo + hi) // 2
            if passes(mid):
                hi = mid
            else:
                lo = mid + 1
        return lo


class CosineSimilaritySensitivity:
    """Ranks layers by the cosine similarity of each layer's output when *that layer alone* is
    quantized (its fake-quant input and weights, fed the float model's real input) to its float
    output, over the calibration batches; worst first.

    Why isolated rather than the end-to-end per-layer report (``amct_torch.quality.report``): in the
    report a layer inherits every upstream layer's error, so a well-calibrated layer behind a
    badly calibrated one ranks worst and the search would leave the wrong layers in float
    (measured on the example model: with conv2 misconfigured the report ranks conv3 first)."""

    def rank(self, float_model: fx.GraphModule, quant_model: fx.GraphModule, batches: Sequence[Any],
             layers: Sequence[str], records: Mapping[str, Any]) -> list[tuple[str, float]]:
        """``quant_model``: the fake-quant model (its layers hold the fake-quant weights);
        ``records``: the factors whose scale_d/offset_d quantize each layer's float input."""
        from amct_torch.algorithms.quant import fake_quant
        from amct_torch.caffe.graph import layer_modules
        from amct_torch.quality.report import _Acc, _first_tensor

        fmods, qmods = layer_modules(float_model), layer_modules(quant_model)
        accs = {n: _Acc() for n in layers}
        handles = []
        for name in layers:
            def hook(_m: nn.Module, args: tuple, out: Any, name: str = name) -> None:
                r = records[name]
                qargs = tuple(fake_quant(a, r.scale_d, r.offset_d) for a in args)
                accs[name].add(_first_tensor(out), _first_tensor(qmods[name](*qargs)))
            handles.append(fmods[name].register_forward_hook(hook))
        try:
            with torch.no_grad():
                for b in batches:
                    float_model(*b) if isinstance(b, tuple) else float_model(b)
        finally:
            for h in handles:
                h.remove()
        rows = [(n, accs[n].cosine()) for n in layers]
        return sorted(rows, key=lambda r: r[1])


@dataclass
class AutoCalibrationResult:
    """``float_layers``: the layers left in float (worst first); ``ranking``: (layer,
    sensitivity) worst first; ``history``: one entry per evaluation (float layer count,
    metric, loss, passed); ``files``: kind → path."""

    original_metric: float
    final_metric: float
    float_layers: list[str]
    ranking: list[tuple[str, float]]
    history: list[dict] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)


def _resolve(kind: str, value: Any, named: dict, method: str) -> Any:
    if isinstance(value, str):
        if value not in named:
            raise AmctError(f"unknown {kind} {value!r}; choose {', '.join(named)} or pass an object "
                            f"with a {method}() method")
        return named[value]()
    if not callable(getattr(value, method, None)):
        raise AmctError(f"{kind} must be a name or an object with a {method}() method")
    return value


def _check_evaluator(ev: Any) -> None:
    missing = [m for m in ("calibration", "evaluate", "metric_eval") if not callable(getattr(ev, m, None))]
    if missing:
        raise AmctError(f"model_evaluator lacks {', '.join(missing)}() (see AutoCalibrationEvaluatorBase)")


def _capture_inputs(model: nn.Module, limit: int) -> tuple[list, Any]:
    """A forward pre-hook keeping (detached copies of) the first ``limit`` inputs of ``model``."""
    seen: list = []

    def hook(_m: nn.Module, args: tuple) -> None:
        if len(seen) < limit:
            a = tuple(x.detach().clone() for x in args)
            seen.append(a[0] if len(a) == 1 else a)
    return seen, model.register_forward_pre_hook(hook)


def _metric(ev: Any, model: nn.Module) -> float:
    with torch.no_grad():
        return float(ev.evaluate(model))


@checked(model_file=path_arg, weights_file=path_arg, config_file=path_arg, record_file=path_arg,
         save_dir=path_arg)
def accuracy_based_auto_calibration(model_file: str, weights_file: str, model_evaluator: Any,
                                    config_file: str, record_file: str, save_dir: str,
                                    strategy: Union[str, Any] = "BinarySearch",
                                    sensitivity: Union[str, Any] = "CosineSimilarity", *,
                                    max_accuracy_drop: Optional[float] = None, iterations: Optional[int] = None,
                                    device: Optional[str] = None, quiet: Optional[bool] = None
                                    ) -> AutoCalibrationResult:
    """Calibrate ``model_file``/``weights_file`` with ``config_file`` (JSON quant config), then
    leave the fewest most-sensitive layers in float that make ``model_evaluator.metric_eval``
    pass.

    Writes ``record_file`` (factors of the layers that stay quantized; overwritten), and under
    the prefix ``save_dir`` (e.g. ``out/model``): ``_final_quant_config.json`` (the config with
    ``quant_enable: false`` for the float layers), ``_sensitivity.json``,
    ``_auto_calibration_history.json`` and the fake-quant/deploy models. ``strategy``:
    "BinarySearch" or an object with ``search(n, passes) -> k``;
    ``sensitivity``: "CosineSimilarity" or an object with ``rank(float_model, quant_model,
    batches, layers, records) -> [(layer, value)]`` worst first.

    ``model_evaluator`` None: a train/test net judges itself (``net_accuracy.py``): it
    calibrates on the first ``batch_num`` batches of its TEST data layers, its metric is its
    first Accuracy top over ``iterations`` batches (as ``caffe test``), and a model passes when
    it loses at most ``max_accuracy_drop`` percentage points (default 0.5; ``iterations``
    default 50); ``device`` and ``quiet`` (no progress bar, the default) apply to it. With a
    ``model_evaluator`` these four are the evaluator's own business: giving one is an
    ``ArgumentError``."""
    from amct_torch.api import init

    own_settings = {"max_accuracy_drop": max_accuracy_drop, "iterations": iterations, "device": device,
                    "quiet": quiet}
    if model_evaluator is not None:
        given = [k for k, v in own_settings.items() if v is not None]
        if given:
            raise ArgumentError(f"accuracy_based_auto_calibration(): {given[0]} applies only without a "
                                "model_evaluator (the net's own Accuracy layer judging); the evaluator "
                                "given decides it")
        _check_evaluator(model_evaluator)
    search = _resolve("strategy", strategy, {"BinarySearch": BinarySearchStrategy}, "search")
    sens = _resolve("sensitivity", sensitivity, {"CosineSimilarity": CosineSimilaritySensitivity}, "rank")
    save_dir = os.fspath(save_dir)
    folder = os.path.dirname(os.path.abspath(save_dir))
    if not os.path.isdir(folder):
        raise AmctError(f"cannot write the outputs: folder {folder} does not exist", file=save_dir)
    graph = init(config_file, model_file, weights_file, record_file)
    own = None
    if model_evaluator is None:  # the net's own data and Accuracy layer
        from amct_torch.quality.net_accuracy import NetAccuracyEvaluator
        own = model_evaluator = NetAccuracyEvaluator(
            model_file, weights_file, batch_num=graph.config.batch_num,
            max_drop_points=0.5 if max_accuracy_drop is None else max_accuracy_drop,
            iterations=50 if iterations is None else iterations, device=device,
            quiet=True if quiet is None else quiet)
    try:
        return _auto_calibrate(graph, model_file, weights_file, model_evaluator, save_dir, search, sens)
    finally:
        if own is not None:
            own.close()


def _auto_calibrate(graph: Any, model_file: str, weights_file: str, model_evaluator: Any, save_dir: str,
                    search: Any, sens: Any) -> AutoCalibrationResult:
    """The calibration, the search and the outputs (``accuracy_based_auto_calibration``)."""
    from amct_torch.caffe.graph import load_caffe
    from amct_torch.config.json_config import write_quant_config_json
    from amct_torch.export.caffe.exporter import write_caffe_models
    from amct_torch.files.atomic import atomic_write_text
    from amct_torch.record import write_record
    from amct_torch.steps import calibrated_records, quantize_weights, start_calibration

    dev = torch.device(getattr(model_evaluator, "device", "cpu"))
    original = _metric(model_evaluator, load_caffe(model_file, weights_file).to(dev).eval())
    quantize_weights(graph)  # in memory: the record file is written once, with the outputs
    session = start_calibration(graph, summaries=False)  # no visual report here
    model = graph.fused.to(dev)
    seen, handle = _capture_inputs(model, graph.config.batch_num)
    try:
        model_evaluator.calibration(model)
    finally:
        handle.remove()
    if not session.done:
        raise CalibrationError(f"the evaluator's calibration() ran {session.batches_seen} "
                               f"batch(es); the config's batch_num is {graph.config.batch_num}")
    records = calibrated_records(graph, graph.record_file)
    skip, metric, ranking, history = _search_float_layers(graph, records, model_evaluator, original, dev,
                                                          seen, search, sens)

    files = _write_outputs(graph, records, skip, ranking, history, original, metric, save_dir,
                           write_quant_config_json, write_record, atomic_write_text,
                           write_caffe_models)
    return AutoCalibrationResult(original, metric, skip, ranking, history, files)


class _Trials:
    """The fake-quant model with some layers left in float, evaluated: each evaluation is
    logged and kept in ``history``; ``cached`` evaluates each count of the worst layers once."""

    def __init__(self, graph: Any, records: dict, ev: Any, original: float, dev: torch.device) -> None:
        self.graph, self.records, self.ev, self.original, self.dev = graph, records, ev, original, dev
        self.history: list[dict] = []
        self.cache: dict[int, tuple[bool, float]] = {}

    def run(self, skip: Sequence[str]) -> tuple[bool, float]:
        """(passes, metric) with the layers ``skip`` in float."""
        from amct_torch.export import fake_quant_graph

        kept = {n: r for n, r in self.records.items() if n not in set(skip)}
        qm = fake_quant_graph(self.graph.fused, kept, self.graph.record_file).to(self.dev).eval()
        metric = _metric(self.ev, qm)
        ok, loss = self.ev.metric_eval(self.original, metric)
        self.history.append({"float_layers": list(skip), "metric": metric, "loss": float(loss),
                             "passed": bool(ok)})
        log.info("auto calibration: %d layer(s) in float -> metric %.6g (%s)", len(skip), metric,
                 "passes" if ok else "fails")
        return bool(ok), metric

    def cached(self, order: Sequence[str], k: int) -> tuple[bool, float]:
        """``run`` with the first ``k`` layers of ``order`` in float, once per ``k``."""
        if k not in self.cache:
            self.cache[k] = self.run(order[:k])
        return self.cache[k]


def _search_float_layers(graph: Any, records: dict, ev: Any, original: float, dev: torch.device,
                         seen: Sequence[Any], search: Any, sens: Any
                         ) -> tuple[list[str], float, list[tuple[str, float]], list[dict]]:
    """The search: the whole int8 model first; when it fails, rank the quantized layers by
    sensitivity and let ``search`` find the fewest worst layers to leave in float. Returns
    (float layers, their metric, the ranking, every evaluation)."""
    trials = _Trials(graph, records, ev, original, dev)
    ok, metric = trials.run([])
    if ok:
        return [], metric, [], trials.history
    ranking = _rank_layers(graph, records, dev, seen, sens)
    order = [name for name, _ in ranking]
    k = int(search.search(len(order), lambda k: trials.cached(order, k)[0]))
    passed, metric = trials.cached(order, k)
    if not passed:
        raise CalibrationError(f"the metric is not met even with {k} of {len(order)} "
                               "quantized layer(s) left in float")
    return order[:k], metric, ranking, trials.history


def _rank_layers(graph: Any, records: dict, dev: torch.device, seen: Sequence[Any],
                 sens: Any) -> list[tuple[str, float]]:
    """``sens``'s ranking (worst first) of the quantized layers, on the captured calibration
    inputs, with every layer quantized."""
    from amct_torch.export import fake_quant_graph

    candidates = [n for n in records if n in set(graph.quant_layers)]
    qm = fake_quant_graph(graph.fused, records, graph.record_file).to(dev).eval()
    return list(sens.rank(graph.fused.eval(), qm, seen, candidates, records))


def _write_outputs(graph: Any, records: dict, skip: Sequence[str], ranking: list, history: list,
                   original: float, metric: float, save_dir: str, write_config: Callable,
                   write_record: Callable, write_text: Callable, export: Optional[Callable]) -> dict:
    """Final config, record without the float layers, sensitivity, history and models."""
    import copy
    import dataclasses

    qc = copy.deepcopy(graph.config)
    qc.layers = {n: dataclasses.replace(c, quant_enable=False) if n in set(skip) else c
                 for n, c in qc.layers.items()}
    files = {"config": f"{save_dir}_final_quant_config.json", "record": graph.record_file,
             "sensitivity": f"{save_dir}_sensitivity.json",
             "history": f"{save_dir}_auto_calibration_history.json"}
    write_config(files["config"], qc)
    kept = {n: r for n, r in records.items() if n not in set(skip)}
    write_record(graph.record_file, kept)
    write_text(files["sensitivity"], json.dumps(
        {"sensitivity": "cosine similarity, fake-quant vs float layer output, worst first",
         "layers": [{"layer": n, "value": v} for n, v in ranking]}, indent=2) + "\n")
    write_text(files["history"], json.dumps(
        {"original_metric": original, "final_metric": metric, "float_layers": list(skip),
         "evaluations": history}, indent=2) + "\n")
    if export is not None:
        for p in export(graph, kept, "Both", save_dir).values():
            files[os.path.basename(p)[len(os.path.basename(save_dir)) + 1:].rsplit(".", 1)[0]] = p
    return files
