"""The visual report: one self-contained HTML page of a calibration (``PREFIX_report.html``),
also shown inline by Jupyter.

Why one file with everything inline: it must open from disk in any browser, be mailed or
attached to a ticket, and never fetch anything. Sections (each a collapsible ``<details>``
with a ``data-section`` name): the summary, the per-layer output error (chart and a sortable,
searchable table), each quantized layer's input histogram and weight ranges, the
improvements, and float vs int8 accuracy when figures are given. The page is a fragment
scoped under ``.amct-report`` (its CSS and a few lines of inline JS), wrapped in a document
for the file. docs/report.md says how to read each section.
"""
from __future__ import annotations

import html
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from amct_torch.errors import AmctError
from amct_torch.files.atomic import atomic_write_text
from amct_torch.quality import charts
from amct_torch.quality.report import COSINE_WARN, LayerStat

#: channels drawn per weight chart at most (wider layers: channels grouped, min/max of each group)
MAX_CHANNELS = 64
#: layers drawn at most, worst first (a chart is ~10 KB and ~0.1 s): a detector's 300 layers
#: would make a page of several MB; the others keep their figures in the tables
MAX_LAYER_CHARTS = 100

SECTIONS = ("summary", "layer-error", "layers", "improvements", "accuracy")
#: the sections of ``amct-torch test``'s page (``caffe_test_html``)
TEST_SECTIONS = ("summary", "accuracy")


@dataclass
class WeightRange:
    """Per output channel (or group of channels, ``group`` wide): weight min, max, and
    ±127·scale_w (the largest weight the int8 grid holds)."""

    mins: list[float]
    maxes: list[float]
    bound: list[float]
    group: int = 1


@dataclass
class ReportInputs:
    """Everything the page shows. ``stats``: the text report's rows (worst first);
    ``records``: the record as written; ``summaries``: record key → ``ActivationSummary``;
    ``floats``: (layer, type, why) of quantizable layers kept in float; ``timings``: phase →
    seconds; ``files``: kind → path written; ``accuracy``: (metric, float, quantized...) rows,
    one quantized figure per name of ``accuracy_forms``."""

    model_file: str
    weights_file: str = ""
    data: str = ""
    config: str = ""
    settings: dict = field(default_factory=dict)
    algorithms: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)
    files: dict = field(default_factory=dict)
    stats: Sequence[LayerStat] = ()
    records: Mapping[str, Any] = field(default_factory=dict)
    types: dict = field(default_factory=dict)
    summaries: Mapping[str, Any] = field(default_factory=dict)
    weights: dict = field(default_factory=dict)
    floats: list = field(default_factory=list)
    improvement: Optional[dict] = None
    accuracy: Optional[Sequence[tuple]] = None
    accuracy_forms: Sequence[str] = ("int8",)
    charts: dict = field(default_factory=dict)


def weight_ranges(fused: Any, records: Mapping[str, Any]) -> dict[str, WeightRange]:
    """Per weighted record layer of ``fused`` (the model the record quantizes): the range of
    each output channel's weights and ±127·scale_w."""
    import torch

    from amct_torch.algorithms.arq import output_channel_major
    from amct_torch.caffe.graph import layer_modules

    mods = layer_modules(fused)
    out: dict[str, WeightRange] = {}
    for name, rec in records.items():
        mod = mods.get(name)
        if mod is None or not rec.scale_w or getattr(mod, "weight", None) is None or mod.caffe_type == "Pooling":
            continue
        w = mod.weight.detach().float()
        rows = output_channel_major(w, mod.caffe_type, int(getattr(mod, "groups", 1))) \
            if len(rec.scale_w) > 1 else w.reshape(1, -1)
        lo, hi = torch.aminmax(rows, dim=1)
        scale = torch.tensor(rec.scale_w, dtype=torch.float32).expand(rows.shape[0]) * 127.0
        group = max(1, math.ceil(rows.shape[0] / MAX_CHANNELS))
        if group > 1:  # min of mins, max of maxes and of bounds per group of channels
            pad = group * math.ceil(rows.shape[0] / group) - rows.shape[0]
            lo = torch.cat([lo.cpu(), lo.cpu()[-1:].expand(pad)]).reshape(-1, group).amin(1)
            hi = torch.cat([hi.cpu(), hi.cpu()[-1:].expand(pad)]).reshape(-1, group).amax(1)
            scale = torch.cat([scale, scale[-1:].expand(pad)]).reshape(-1, group).amax(1)
        out[name] = WeightRange(lo.cpu().tolist(), hi.cpu().tolist(), scale.tolist(), group)
    return out


def float_layers(graph: Any, records: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(layer, type, why) of the model's quantizable layers that the record leaves in float."""
    out = []
    for info in graph.layers:
        if not info.quantizable or info.name in records:
            continue
        cfg = graph.config.layers.get(info.name)
        why = "skipped (quant_enable false)" if cfg is not None else "skipped (not in the config)"
        out.append((info.name, info.type, why))
    return out


def charted_layers(inp: ReportInputs) -> list[str]:
    """The record keys that get a chart: the worst ``MAX_LAYER_CHARTS`` of the text report's
    order, then any record key it lacks (joint entries), up to the cap."""
    order = [s.layer for s in inp.stats if s.layer in inp.records]
    order += [k for k in inp.records if k not in set(order)]
    return order[:MAX_LAYER_CHARTS]


def render_charts(inp: ReportInputs) -> dict[str, str]:
    """Every chart of the page as SVG text ({} without matplotlib): ``errors`` and one per
    quantized layer."""
    if not charts.available():
        return {}
    out = {}
    if inp.stats:
        out["errors"] = charts.error_chart(inp.stats, [f[0] for f in inp.floats], COSINE_WARN)
    drawer = charts.LayerCharts()
    for name in charted_layers(inp):
        rec = inp.records[name]
        summary = inp.summaries.get(name)
        weight = inp.weights.get(name)
        if summary is None and weight is None:
            continue
        final = None
        if rec.scale_d is not None and rec.offset_d is not None:
            from amct_torch.calibration.summaries import clip_range
            final = clip_range(rec.scale_d, rec.offset_d)
        out[name] = drawer.draw(summary, final,
                                       (weight.mins, weight.maxes, weight.bound) if weight else None)
    return out


# -- HTML -----------------------------------------------------------------------------------

def _e(v: Any) -> str:
    return html.escape(str(v), quote=True)


def _num(v: Optional[float], fmt: str) -> str:
    if v is None:
        return "–"
    if isinstance(v, float) and not math.isfinite(v):
        return "inf" if v > 0 else ("-inf" if v < 0 else "nan")
    return format(v, fmt)


def _table(head: Sequence[str], rows: Sequence[Sequence[Any]], cls: str = "") -> str:
    """A table; a cell given as (text, sort key) sorts by the key."""
    th = "".join(f"<th>{_e(h)}</th>" for h in head)
    body = []
    for row in rows:
        cells = []
        for c in row:
            if isinstance(c, tuple):
                cells.append(f'<td data-v="{_e(c[1])}">{_e(c[0])}</td>')
            else:
                cells.append(f"<td>{_e(c)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    c = f' class="{cls}"' if cls else ""
    return f"<table{c}><thead><tr>{th}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _section(name: str, title: str, body: str, open_: bool = True) -> str:
    o = " open" if open_ else ""
    return f'<details class="sec" data-section="{name}"{o}><summary>{_e(title)}</summary>{body}</details>'


def _summary(inp: ReportInputs) -> str:
    rows = [("model", inp.model_file), ("weights", inp.weights_file), ("data", inp.data),
            ("config", inp.config)] + [(k, v) for k, v in inp.settings.items()]
    rows += [(k, v) for k, v in inp.algorithms.items()]
    quant = len(inp.stats)
    bad = sum(1 for s in inp.stats if s.flagged)
    rows.append(("layers", f"{quant} quantized ({bad} below cosine {COSINE_WARN}), {len(inp.floats)} kept in float"))
    out = _table(("", ""), rows, "kv")
    if inp.timings:
        total = sum(inp.timings.values())
        trs = [(k, (f"{v:.2f} s", v)) for k, v in inp.timings.items()] + [("total", (f"{total:.2f} s", total))]
        out += "<h3>time per phase</h3>" + _table(("phase", "seconds"), trs)
    if inp.files:
        out += "<h3>files written</h3>" + _table(("kind", "path"), sorted(inp.files.items()))
    return out


def _layer_error(inp: ReportInputs) -> str:
    chart = inp.charts.get("errors", "")
    rows = []
    for s in inp.stats:
        rec = inp.records.get(s.layer)
        summ = inp.summaries.get(s.layer)
        share = summ.clipped_share * 100 if summ is not None else None
        rows.append(((s.layer, s.layer), (s.type, s.type), ("below 0.99" if s.flagged else "quantized", int(s.flagged)),
                     (_num(s.cosine, ".5f"), s.cosine), (_num(s.sqnr_db, ".2f"), _sortable(s.sqnr_db)),
                     (_num(share, ".3g"), share if share is not None else -1),
                     (_num(getattr(rec, "scale_d", None), ".9g"), getattr(rec, "scale_d", None) or 0),
                     (_num(getattr(rec, "offset_d", None), "d"), getattr(rec, "offset_d", None) or 0)))
    for name, ltype, why in inp.floats:
        rows.append(((name, name), (ltype, ltype), (f"float: {why}", 2), ("–", 2), ("–", 1e9),
                     ("–", -1), ("–", 0), ("–", 0)))
    head = ("layer", "type", "status", "cosine", "SQNR dB", "clipped %", "scale_d", "offset_d")
    note = ("<p>Output of each quantized layer in the fake-quant model against the float model "
            "(worst first; click a column to sort, type to filter).</p>")
    return note + chart + _table(head, rows, "sortable layers")


def _sortable(v: float) -> float:
    return v if math.isfinite(v) else (1e9 if v > 0 else -1e9)


def _layers(inp: ReportInputs) -> str:
    order = [s.layer for s in inp.stats] + [k for k in inp.records if k not in {s.layer for s in inp.stats}]
    parts = ["<p>Blue: the layer's input on the calibration data (log counts) and the weight range of "
             "each output channel; orange: the int8 clip the observer chose and ±127·scale_w; red dashed: "
             "the final clip where an improvement moved it; ticks under the histogram: every 32nd code "
             "of the grid.</p>"]
    if not inp.charts:
        parts.append("<p class='warn'>Charts need matplotlib: <code>pip install matplotlib</code>, "
                     "then run again.</p>")
    elif len(inp.records) > MAX_LAYER_CHARTS:
        parts.append(f"<p class='warn'>Charts of the {MAX_LAYER_CHARTS} worst layers; the others have "
                     "their figures only.</p>")
    for name in order:
        rec = inp.records.get(name)
        if rec is None:
            continue
        stat = next((s for s in inp.stats if s.layer == name), None)
        summ = inp.summaries.get(name)
        wr = inp.weights.get(name)
        kv = [("type", inp.types.get(name, stat.type if stat else "?"))]
        if stat is not None:
            kv += [("cosine", _num(stat.cosine, ".5f")), ("SQNR dB", _num(stat.sqnr_db, ".2f"))]
        if rec.scale_d is not None:
            from amct_torch.calibration.summaries import clip_range
            lo, hi = clip_range(rec.scale_d, rec.offset_d or 0)
            kv += [("scale_d", _num(rec.scale_d, ".9g")), ("offset_d", rec.offset_d),
                   ("int8 range", f"[{lo:.6g}, {hi:.6g}]")]
        if summ is not None:
            kv += [("algorithm", summ.algo), ("values seen", summ.count),
                   ("min / max seen", f"{summ.lo:.6g} / {summ.hi:.6g}"),
                   ("clipped", f"{100 * summ.clipped_share:.3g}% "
                               f"({summ.clipped_low} below, {summ.clipped_high} above)")]
            if (summ.scale, summ.offset) != (rec.scale_d, rec.offset_d):
                kv.append(("calibrated clip",
                           f"scale {summ.scale:.9g}, offset {summ.offset} (an improvement moved it)"))
        if rec.scale_w:
            kv += [("scale_w", f"{len(rec.scale_w)} value(s), {min(rec.scale_w):.6g} … {max(rec.scale_w):.6g}")]
        if wr is not None and wr.group > 1:
            kv.append(("chart", f"weights: channels in groups of {wr.group}"))
        flag = " flag" if stat is not None and stat.flagged else ""
        head = f"{_e(name)} <span class='t'>{_e(kv[0][1])}</span>"
        if stat is not None:
            head += f" <span class='n{flag}'>cos {_num(stat.cosine, '.5f')} · {_num(stat.sqnr_db, '.2f')} dB</span>"
        body = _table(("", ""), kv[1:], "kv") + inp.charts.get(name, "")
        parts.append(f'<details class="layer" data-layer="{_e(name)}"><summary>{head}</summary>{body}</details>')
    return "".join(parts)


def _improvements(inp: ReportInputs) -> str:
    imp = inp.improvement
    if not imp:
        return "<p>No improvement ran (<code>--improve</code>): the record is AMCT's result.</p>"
    from amct_torch.improve.pipeline import summary_line
    rows = []
    for st in imp.get("stages", []):
        gains = " / ".join(f"{g:+.2f} ± {e:.2f}" for g, e in zip(st.get("output_gain_db", []),
                                                                  st.get("output_error_db", [])))
        verdict = "kept" if st["name"] == imp.get("kept") else ("passed" if st.get("passed") else "rejected")
        rows.append((st["name"], _num(st.get("worst_output_sqnr_db"), ".2f"), _num(st.get("gain_db"), "+.2f"),
                     gains or "–", verdict, _num(st.get("seconds"), ".1f")))
    text = (f"<p>Kept: <b>{_e(imp.get('kept'))}</b>. Each stage is judged on the net outputs against the "
            "float model on rows it was not fitted on; it is kept only where no output gets worse "
            "(docs/algorithms.md).</p>")
    head = ("stage", "worst output SQNR dB", "gain dB", "per-output gain ± error dB", "verdict", "seconds")
    return text + _table(head, rows) + f"<p><code>{_e(summary_line(imp))}</code></p>"


def _accuracy(inp: ReportInputs) -> str:
    if not inp.accuracy:
        return "<p>No accuracy figures: run <code>amct-torch test</code> on labelled data to fill this.</p>"
    return accuracy_table(inp.accuracy, inp.accuracy_forms)


def accuracy_table(rows: Sequence[Sequence[Any]], forms: Sequence[str]) -> str:
    """Rows of (metric, float, one figure per quantized form) as a table with each form's drop
    (float minus the form: positive is accuracy lost), figures as ``amct-torch test`` prints them."""
    out = []
    for metric, flt, *quant in rows:
        out.append([metric, _num(flt, ".6g")] + [_num(q, ".6g") for q in quant]
                   + [_num(flt - q, "+.6g") for q in quant])
    head = ["metric", "float", *forms] + [f"drop ({f})" for f in forms]
    return _table(head, out)


CSS = """
.amct-report{font:13px/1.4 system-ui,sans-serif;color:#222;max-width:1100px}
.amct-report h1{font-size:18px;margin:4px 0}.amct-report h3{font-size:13px;margin:8px 0 2px}
.amct-report details.sec{border:1px solid #ddd;border-radius:4px;margin:8px 0;padding:4px 8px}
.amct-report details.sec>summary{font-weight:600;font-size:15px;cursor:pointer}
.amct-report details.layer{border-top:1px solid #eee;padding:2px 0}
.amct-report details.layer>summary{cursor:pointer}
.amct-report .t{color:#777}.amct-report .n{color:#1f77b4}.amct-report .flag{color:#d62728;font-weight:600}
.amct-report table{border-collapse:collapse;margin:4px 0}
.amct-report td,.amct-report th{padding:1px 8px;text-align:left;border-bottom:1px solid #f0f0f0}
.amct-report table.sortable th{cursor:pointer;background:#f7f7f7}
.amct-report table.kv td:first-child{color:#666}
.amct-report svg{max-width:100%;height:auto;display:block}
.amct-report svg text{font-family:'DejaVu Sans',sans-serif}
.amct-report .warn{color:#a15c00}.amct-report input{margin:4px 0;width:260px}
"""

# sort a table by a clicked column (numbers by data-v), filter rows and layer sections by name
JS = """
(function(root){if(!root)return;
var num=function(v){var n=parseFloat(v);return isNaN(n)?null:n;};
root.querySelectorAll('table.sortable th').forEach(function(th,i){th.onclick=function(){
 var tb=th.closest('table').tBodies[0],rows=Array.from(tb.rows);
 var d=th.dataset.d==='1'?-1:1;th.dataset.d=d===1?'1':'0';
 rows.sort(function(a,b){var x=a.cells[i].dataset.v,y=b.cells[i].dataset.v,nx=num(x),ny=num(y);
  return d*((nx===null||ny===null)?String(x).localeCompare(String(y)):nx-ny);});
 rows.forEach(function(r){tb.appendChild(r);});};});
var q=root.querySelector('input.search');
if(q)q.oninput=function(){var s=q.value.toLowerCase();
 var hide=function(name){return name.toLowerCase().indexOf(s)<0?'none':'';};
 root.querySelectorAll('table.layers tbody tr').forEach(function(r){r.style.display=hide(r.cells[0].textContent);});
 root.querySelectorAll('details.layer').forEach(function(d){d.style.display=hide(d.dataset.layer);});};
})(document.currentScript&&document.currentScript.parentNode);
"""


def render(inp: ReportInputs) -> str:
    """The report as an HTML fragment (a ``div.amct-report``, its style and script inline)."""
    if not inp.charts:
        inp.charts = render_charts(inp)
    title = os.path.basename(inp.model_file)
    body = [f"<style>{CSS}</style><h1>amct-torch report: {_e(title)}</h1>",
            '<input class="search" type="search" placeholder="filter layers by name">',
            _section("summary", "Summary", _summary(inp)),
            _section("layer-error", "Per-layer output error", _layer_error(inp)),
            _section("layers", f"Quantized layers ({len(inp.records)}): input histogram and weight ranges",
                     _layers(inp), open_=len(inp.records) <= 20),
            _section("improvements", "Improvements", _improvements(inp)),
            _section("accuracy", "Accuracy: float vs int8", _accuracy(inp)),
            f"<script>{JS}</script>"]
    return '<div class="amct-report">' + "".join(body) + "</div>"


def evaluation_html(stats: Sequence[Any]) -> str:
    """``evaluate``'s rows (``OutputStats``) as a sortable table in the report's style."""
    rows = [(s.name, str(list(s.shape)),
             (_num(s.sqnr_db, ".2f"), _sortable(s.sqnr_db) if s.sqnr_db is not None else -1e9),
             (_num(s.cosine, ".6f"), s.cosine if s.cosine is not None else -1),
             _num(s.max_abs_diff, ".4g"), s.note) for s in stats]
    table = _table(("output", "shape", "SQNR dB", "cosine", "max |diff|", "note"), rows, "sortable")
    return (f'<div class="amct-report"><style>{CSS}</style><h3>amct-torch evaluate: each output against '
            f"the reference</h3>{table}<script>{JS}</script></div>")


def caffe_test_html(result: Any, labels: Mapping[str, str]) -> str:
    """``amct-torch test``'s result (``CaffeTestResult``) as a report fragment: a summary (the
    files, iterations, images per second of each form) and the accuracy section (every scalar
    net output of the float model and of each quantized form, with its drop)."""
    forms = result.forms
    flt = forms[0]
    kv = [("model", flt.files[0]), ("weights", flt.files[1] if len(flt.files) > 1 else ""),
          ("iterations", f"{result.iterations} of {result.batch_size} image(s)")]
    if result.quantized:
        from amct_torch.files.output_names import output_path
        kv.append(("quantized prefix", result.quantized))
        if os.path.isfile(output_path(result.quantized, "html_report")):
            kv.append(("calibrate report", output_path(result.quantized, "html_report")))
    runs = [(labels[f.form], ", ".join(f.files), f.images, _num(f.seconds, ".2f"),
             _num(f.images_per_second, ".1f")) for f in forms]
    summary = (_table(("", ""), kv, "kv") + "<h3>models scored</h3>"
               + _table(("form", "files", "images", "seconds", "images/s"), runs))
    rows = [(label, flt.outputs[name], *(f.outputs[name] for f in forms[1:])) for name, label in result.labels()]
    accuracy = (accuracy_table(rows, [labels[f.form] for f in forms[1:]]) if len(forms) > 1 else
                "<p>Float only: run with <code>--quantized PREFIX</code> to score the quantized models.</p>"
                + _table(("metric", "float"), [(r[0], _num(r[1], ".6g")) for r in rows]))
    title = os.path.basename(flt.files[0])
    body = [f"<style>{CSS}</style><h1>amct-torch test: {_e(title)}</h1>",
            _section("summary", "Summary", summary),
            _section("accuracy", "Accuracy: float vs int8", accuracy)]
    return '<div class="amct-report">' + "".join(body) + "</div>"


def page(fragment: str, title: str = "amct-torch report") -> str:
    """A whole HTML document around a ``render`` fragment."""
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
            f'<meta name="viewport" content="width=device-width"></head><body>{fragment}</body></html>\n')


def write_html(path: str, inp: ReportInputs) -> str:
    """Render ``inp`` and write the page atomically at ``path``; returns the fragment."""
    fragment = render(inp)
    write_page(path, fragment, f"amct-torch report: {os.path.basename(inp.model_file)}")
    return fragment


def check_page_path(path: str, inputs: Sequence[str], what: str = "--report-html") -> str:
    """Refuse, before any work, a page path that names a folder, an input file or a file in
    a folder that does not exist (``AmctError`` naming it)."""
    from amct_torch.files.transaction import check_output_name, check_outputs
    path = check_output_name(path, what, (".tmp",))
    check_outputs([path], inputs)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise AmctError(f"{what}: the folder {folder} does not exist", file=path)
    return path


def write_page(path: str, fragment: str, title: str) -> None:
    """A fragment (``render``, ``caffe_test_html``, ``evaluation_html``) as a whole page,
    written atomically at ``path`` (never half-written)."""
    atomic_write_text(path, page(fragment, title))
