"""What ``calibrate`` and ``convert`` print on standard output: the calibration summary (one row
per record entry), the per-layer accuracy table and the files written.
"""
from __future__ import annotations

import sys
from typing import Any, Optional


def print_summary(result: Any, out: Optional[Any] = None) -> None:
    """The layers quantized, the batches and samples used, the ONNX layers run in float, the
    improvement line."""
    out = out or sys.stdout
    qc = result.graph.config
    infos = {l.name: l for l in result.graph.layers}
    rows = []
    for name, r in result.records.items():
        cfg = qc.layers.get(name)
        algo = (cfg.act_algo if cfg is not None else "ifmr (joint)")
        nw = len(r.scale_w)
        weighted = infos.get(name) is not None and infos[name].weighted
        rows.append((name, algo, f"{r.scale_d:.6g}", str(r.offset_d),
                     "-" if not (nw and weighted) else ("per-tensor" if nw == 1 else f"{nw} channels")))
    head = ("layer", "act algo", "scale_d", "offset_d", "weights")
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    used = ""
    if getattr(result, "samples_used", None) is not None:
        total = result.samples_total
        used = (f", {result.samples_used} sample(s)" if total is None else
                f", {result.samples_used} of {total} sample(s)")
    print(f"\nquantized {len(rows)} layer(s), {qc.batch_num} calibration batch(es){used} on "
          f"{result.device}", file=out)
    print(fmt.format(*head), file=out)
    for r in rows:
        print(fmt.format(*r), file=out)
    if "onnx" in result.files:  # the quantized layers ONNX Runtime runs in float, and why
        from amct_torch.export import ort_float_layers
        per_channel = {n: len(r.scale_w) > 1 for n, r in result.records.items()}
        for name, why in ort_float_layers(result.float_model, per_channel):
            print(f"onnx: '{name}' runs in float in ONNX Runtime: {why}", file=out)
    imp = getattr(result, "improvement", None)
    if imp:  # what was kept, on how many rows, each stage's per-output gain ± error and cost
        from amct_torch.improve import summary_line
        print(summary_line(imp), file=out)


def print_report(result: Any, rows: int) -> None:
    """The ``rows`` worst layers of the per-layer report, when there is one."""
    if result.report:
        from amct_torch.quality import format_table
        print("\nper-layer accuracy (fake-quant vs float output, worst first):")
        print(format_table(result.report, limit=rows))


def print_files(files: dict) -> None:
    """Each file written, by kind."""
    print("\nwritten:")
    width = max((len(k) for k in files), default=0)
    for kind, p in files.items():
        print(f"  {kind:<{width}}  {p}")
