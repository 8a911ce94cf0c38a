"""The activation calibration algorithms (IFMR, HFMG), each declared once.

An entry holds what every reader, writer and the calibration ask of an algorithm: its name
(``act_algo`` in the JSON config), its quant.cfg message (the ``CalibrationConfig`` member), its
per-layer fields in JSON key order with their defaults and checks (names shared by
``LayerQuantConfig``, the JSON keys and the observer's keyword arguments), the check over all of
them, and its observer classes in ``calibration/observers.py`` (per IFMR mode), whose ``merge``
is its merge rule. What adding one touches: docs/extending.md.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Optional

from amct_torch.config.checks import check_bins, check_percentile, check_search


@dataclass(frozen=True)
class Field:
    """One per-layer setting of an algorithm. ``kind``: "number" (float), "integer" or "range"
    (a [start, end] pair); ``proto``: its quant.cfg field(s) in the algorithm's message (two
    for a range); ``check(name, value)``: an error text or None."""

    name: str
    default: Any
    kind: str
    proto: tuple[str, ...]
    check: Optional[Callable[[str, Any], Optional[str]]] = None


@dataclass(frozen=True)
class ActAlgorithm:
    """One activation calibration algorithm (see the module docstring)."""

    name: str
    title: str
    proto_field: str
    fields: tuple[Field, ...]
    observers: Mapping[str, str]  # IFMR mode -> observer class name ("" = any mode)
    check: Optional[Callable[[Mapping[str, Any]], Optional[str]]] = None

    def defaults(self) -> dict[str, Any]:
        """The fields' defaults by name."""
        return {f.name: f.default for f in self.fields}

    def layer_fields(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """Every algorithm's per-layer fields for ``LayerQuantConfig``: this one's ``values``,
        the other algorithms' None."""
        out = {f.name: None for a in ACT_ALGORITHMS.values() for f in a.fields}
        out.update({f.name: values[f.name] for f in self.fields})
        return out

    def observer_class(self, ifmr_mode: str) -> Optional[str]:
        """The observer class name for the IFMR mode, or None for an unknown mode."""
        return self.observers.get("", self.observers.get(ifmr_mode))


def _check_search(values: Mapping[str, Any]) -> Optional[str]:
    start, end = values["search_range"]
    return check_search(float(start), float(end), values["search_step"])


IFMR = ActAlgorithm(
    name="ifmr", title="IFMR", proto_field="ifmr_quantize",
    fields=(Field("max_percentile", 0.999999, "number", ("max_percentile",), check_percentile),
            Field("min_percentile", 0.999999, "number", ("min_percentile",), check_percentile),
            Field("search_range", (0.7, 1.3), "range", ("search_range_start", "search_range_end")),
            Field("search_step", 0.01, "number", ("search_step",))),
    observers={"streaming": "IfmrStreamingObserver", "exact": "IfmrExactObserver"},
    check=_check_search)

HFMG = ActAlgorithm(
    name="hfmg", title="HFMG", proto_field="hfmg_quantize",
    fields=(Field("num_of_bins", 4096, "integer", ("num_of_bins",), lambda _name, v: check_bins(v)),),
    observers={"": "HfmgObserver"})

#: by ``act_algo`` name; the first is the default
ACT_ALGORITHMS: dict[str, ActAlgorithm] = {a.name: a for a in (IFMR, HFMG)}
DEFAULT = IFMR


def by_proto_field(member: Optional[str]) -> Optional[ActAlgorithm]:
    """The algorithm of a quant.cfg ``CalibrationConfig`` member, or None."""
    return next((a for a in ACT_ALGORITHMS.values() if a.proto_field == member), None)


def act_key(cfg: Any) -> tuple:
    """The settings that decide an activation calibration (equal keys: equal factors)."""
    algo = ACT_ALGORITHMS[cfg.act_algo]
    values = [getattr(cfg, f.name) for f in algo.fields]
    values = [tuple(v or ()) if f.kind == "range" else v for f, v in zip(algo.fields, values)]
    return (algo.name, *values, cfg.asymmetric)
