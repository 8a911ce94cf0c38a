"""What the visual report (``PREFIX_report.html``) costs: time added to the one-call job and
the page's size, on the nsfw ResNet-50 and on a ~300-layer SSD-style detector built by code.

Why both measures: the page is written by every calibrate with a report, so its cost must
stay small beside the job (target: at most 5 % of the nsfw job), and it must stay readable
and light at a detector's layer count. Each case runs the job in this process, alternating
the page on and off (the JSON per-layer report runs in both; "off" replaces the page's
writer by nothing), and times the report's own steps: the observers' summaries (in the
calibration's finish), the inputs and layer charts (the charts on a helper thread during the
per-layer forwards), the page's writing, measured on the main thread.

Printed (JSON lines): per case and repetition a ``job`` row (wall and CPU seconds of the
process, all threads); a ``summary`` row with medians, the on/off ratios of wall and CPU time
(on a busy machine the CPU ratio is the steadier one; it counts the helper thread's charts in
full, where the wall time hides them behind the forwards on an idle core), the report's
main-thread seconds over the job's, and the page's bytes.

Run: .venv/bin/python benchmarks/bench_report.py [--repeats 3] [--cases nsfw,detector] [--device cpu]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

from nsfw_data import nsfw_files  # benchmarks/, run as scripts

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))


def emit(**kw: Any) -> None:
    print(json.dumps(kw), flush=True)


class Timed:
    """Wraps ``owner.name`` and sums the seconds its calls take (on the calling thread)."""

    def __init__(self, owner: Any, name: str) -> None:
        self.owner, self.name, self.orig, self.seconds = owner, name, getattr(owner, name), 0.0

        def wrapper(*a: Any, **kw: Any) -> Any:
            t = time.perf_counter()
            try:
                return self.orig(*a, **kw)
            finally:
                self.seconds += time.perf_counter() - t
        setattr(owner, name, wrapper)

    def restore(self) -> None:
        setattr(self.owner, self.name, self.orig)


class NoPage:
    """Stands in for the page's writer: the job as it was without the visual report."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        pass

    def write(self, path: str, stats: Any) -> None:
        open(path, "w").close()  # the job lists the file: an empty one


def cases(which: list[str], folder: str) -> dict[str, tuple[str, str, Any, dict]]:
    import numpy as np

    out = {}
    if "nsfw" in which:
        from helpers.data import natural_images_bgr
        out["nsfw"] = (*nsfw_files(), natural_images_bgr(count=32), {"batch_num": 4, "batch_size": 8})
    if "detector" in which:
        from helpers.detector import detector_net
        x = np.random.default_rng(0).standard_normal((16, 3, 64, 64)).astype(np.float32)
        out["detector"] = (*detector_net(folder), x, {"batch_num": 2, "batch_size": 8})
    return out


def run_job(model: str, weights: str, data: Any, kw: dict, out: str, page: bool, device: str) -> dict:
    import amct_torch
    from amct_torch.calibration import summaries
    from amct_torch.quality import job_report

    timers = [Timed(summaries, "summarize")]
    pending = job_report.PendingReport
    if page:
        timers += [Timed(pending, "__init__"), Timed(pending, "write")]
    else:
        job_report.PendingReport = NoPage  # type: ignore[misc, assignment]
        summaries.summarize = lambda *a: None  # type: ignore[assignment]
    try:
        t, cpu = time.perf_counter(), time.process_time()
        res = amct_torch.quantize(model, weights, data, output=out, save_type="Both", quiet=True,
                                  device=device, **kw)
        wall, cpu = time.perf_counter() - t, time.process_time() - cpu
    finally:
        job_report.PendingReport = pending  # type: ignore[misc]
        for tm in timers:
            tm.restore()
    row = {"seconds": round(wall, 3), "cpu_seconds": round(cpu, 3), "page": page, "report_main_thread_s": round(sum(t.seconds for t in timers), 3),
           "summaries_s": round(timers[0].seconds, 3), "layers": len(res.records)}
    if page:
        row["page_bytes"] = os.path.getsize(res.files["html_report"])
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cases", default="nsfw,detector")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for name, (model, weights, data, kw) in cases(args.cases.split(","), tmp).items():
            rows: dict[bool, list[dict]] = {True: [], False: []}
            for rep in range(args.repeats):
                for page in ((True, False) if rep % 2 == 0 else (False, True)):
                    row = run_job(model, weights, data, kw, os.path.join(tmp, name), page, args.device)
                    rows[page].append(row)
                    emit(kind="job", case=name, rep=rep, **row)
            on = statistics.median(r["seconds"] for r in rows[True])
            off = statistics.median(r["seconds"] for r in rows[False])
            main_s = statistics.median(r["report_main_thread_s"] for r in rows[True])
            cpu_on = statistics.median(r["cpu_seconds"] for r in rows[True])
            cpu_off = statistics.median(r["cpu_seconds"] for r in rows[False])
            emit(kind="summary", case=name, device=args.device, layers=rows[True][0]["layers"],
                 job_s_page_on=on, job_s_page_off=off, on_over_off=round(on / off, 4),
                 cpu_s_page_on=cpu_on, cpu_s_page_off=cpu_off, cpu_on_over_off=round(cpu_on / cpu_off, 4),
                 report_main_thread_s=main_s, report_main_thread_share=round(main_s / on, 4),
                 page_bytes=rows[True][0]["page_bytes"])


if __name__ == "__main__":
    main()
