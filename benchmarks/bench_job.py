"""End-to-end job benchmark: the real ``amct-torch calibrate`` command against ONNX Runtime's own
quantizer (``quantize_static``, MinMax, QDQ, per-channel) on the same model and images.

Why: users judge the tool by the whole command (import, load the Caffe model, fuse, ARQ,
calibrate, write the record and every model), not by a kernel. Each job runs as its own child
process; ``os.wait4`` gives that child's wall time, user and system CPU time and peak RSS. The
two jobs alternate (the order flips every repetition) so that load on a shared machine hits
both alike, and the ratios are taken from medians of the same run.

Model: the nsfw package's Caffe ResNet-50-1by2. Images: natural photographs from scikit-image
and scikit-learn, cropped and flipped at random (seeded) into distinct 256×256 JPEGs; both
jobs resize to 256 on the shorter side, centre-crop 224 and subtract the mean 104,117,123 (BGR,
as Caffe). ORT quantizes the project's own float ONNX export of the same BN-fused model.

Printed (JSON lines): per size (32 images at batch 8, 256 at batch 32) one ``job`` row per
job and repetition, a ``summary`` row with medians and ratios (ours / ORT; report on / off),
and a ``phases`` row: seconds per phase of our job in one extra instrumented run.

Run: .venv/bin/python benchmarks/bench_job.py [--repeats 3] [--sizes 32x8,256x32]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Optional

from nsfw_data import nsfw_files  # benchmarks/, run as scripts

MEAN = (104.0, 117.0, 123.0)
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def emit(**kw: Any) -> None:
    print(json.dumps(kw), flush=True)


def make_images(folder: str, n: int, seed: int = 0) -> None:
    """``n`` distinct 256×256 BGR JPEGs: seeded random crops (half to all of the shorter side,
    aspect 3:4 to 4:3) and flips of the natural photographs scikit-image and scikit-learn ship."""
    import cv2
    import numpy as np
    import skimage.data as sk
    from sklearn.datasets import load_sample_images

    srcs = [getattr(sk, name)() for name in ("astronaut", "chelsea", "coffee", "rocket", "camera",
                                             "hubble_deep_field", "immunohistochemistry", "retina")]
    srcs += list(load_sample_images().images)
    srcs = [np.repeat(s[:, :, None], 3, axis=2) if s.ndim == 2 else s for s in srcs]
    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    for i in range(n):
        img = srcs[i % len(srcs)]
        h, w = img.shape[:2]
        side = rng.uniform(0.5, 1.0) * min(h, w)
        aspect = rng.uniform(0.75, 4 / 3)
        ch, cw = min(h, int(side * aspect)), min(w, int(side / aspect))
        y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
        crop = img[y:y + ch, x:x + cw]
        if rng.random() < 0.5:
            crop = crop[:, ::-1]
        out = cv2.resize(np.ascontiguousarray(crop), (256, 256), interpolation=cv2.INTER_AREA)
        cv2.imwrite(os.path.join(folder, f"img_{i:04d}.jpg"), out[:, :, ::-1],
                    [cv2.IMWRITE_JPEG_QUALITY, 92])


def run_child(cmd: list[str], env: Optional[dict] = None) -> dict:
    """Run ``cmd`` to the end; its wall time and its own rusage (user, system, peak RSS)."""
    with tempfile.TemporaryFile() as fout, tempfile.TemporaryFile() as ferr:
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=fout, stderr=ferr, env=env)
        # wait4 returns the rusage of exactly this child (not of every child waited for so far)
        _, status, ru = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t
        fout.seek(0)
        ferr.seek(0)
        out, err = fout.read(), ferr.read()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[:4]} failed ({proc.returncode}):\n{err.decode()[-3000:]}")
    return {"wall_s": round(wall, 3), "user_s": round(ru.ru_utime, 3), "sys_s": round(ru.ru_stime, 3),
            "cpu_s": round(ru.ru_utime + ru.ru_stime, 3), "peak_rss_mib": round(ru.ru_maxrss / 1024, 1),
            "stdout": out.decode(errors="replace")}


def ours_cmd(proto: str, weights: str, images: str, batch: int, n: int, out: str,
             report: bool, extra: tuple = ()) -> list[str]:
    exe = os.path.join(os.path.dirname(sys.executable), "amct-torch")
    return [exe, *extra, "calibrate", proto, weights, images, "--mean", ",".join(str(int(m)) for m in MEAN),
            "--resize", "256", "--crop", "224", "--batch-size", str(batch), "--batch-num", str(n // batch),
            "--device", "cpu", "-q", "--report-batches", "2" if report else "0", "--output", out]


# ----- ORT child ---------------------------------------------------------------------------

def ort_child(float_onnx: str, images: str, batch: int, out: str) -> None:
    """ONNX Runtime's static quantization of ``float_onnx``: MinMax, QDQ, per-channel weights,
    fed the same preprocessed images in batches of ``batch``."""
    import cv2
    import numpy as np
    from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat,
                                          quantize_static)
    import onnx

    input_name = onnx.load(float_onnx, load_external_data=False).graph.input[0].name
    files = sorted(os.path.join(images, f) for f in os.listdir(images))
    mean = np.asarray(MEAN, dtype=np.float32)

    def load(path: str) -> np.ndarray:
        img = cv2.imread(path, cv2.IMREAD_COLOR)
        h, w = img.shape[:2]
        f = 256 / min(h, w)
        img = cv2.resize(img, (max(1, round(w * f)), max(1, round(h * f))), interpolation=cv2.INTER_LINEAR)
        h, w = img.shape[:2]
        y, x = (h - 224) // 2, (w - 224) // 2
        arr = img[y:y + 224, x:x + 224].astype(np.float32) - mean
        return arr.transpose(2, 0, 1)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.i = 0

        def get_next(self):
            if self.i >= len(files):
                return None
            chunk = files[self.i:self.i + batch]
            self.i += batch
            return {input_name: np.stack([load(p) for p in chunk])}

    quantize_static(float_onnx, out, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    calibrate_method=CalibrationMethod.MinMax)


# ----- instrumented child: per-phase times of our job ----------------------------------------

def phases_child(argv: list[str]) -> None:
    """Run the CLI in this process with the job's phases timed (wrapping the functions the
    one-call API calls); prints one JSON object of phase -> seconds."""
    # the command's own process set-up (idle-thread policy, memory reuse), before torch loads
    try:
        from amct_torch.threads import prefer_passive_waits
        prefer_passive_waits()
    except ImportError:  # an older revision
        pass
    try:
        from amct_torch.malloc_tuning import keep_freed_memory
        keep_freed_memory()
    except ImportError:
        pass
    t0 = time.perf_counter()
    import torch  # noqa: F401
    t_torch = time.perf_counter() - t0
    from amct_torch import cli
    from amct_torch.workflow import job as oneshot
    times: dict[str, float] = {"import_torch": t_torch, "import_rest": time.perf_counter() - t0 - t_torch}

    def wrap(mod: Any, attr: str, phase: str) -> None:
        fn = getattr(mod, attr, None)
        if fn is None:
            return

        def timed(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                times[phase] = times.get(phase, 0.0) + time.perf_counter() - t
        setattr(mod, attr, timed)

    import amct_torch.caffe.graph as graph
    import amct_torch.caffe.netio as netio
    import amct_torch.export.graph_outputs as graph_outputs
    wrap(netio, "read_net", "load_read_net")
    wrap(graph, "build_graph", "load_build_graph")
    wrap(oneshot, "_config_json", "config_json")
    wrap(oneshot, "load", "load_total")
    wrap(oneshot, "quantize_weights", "fuse_arq")
    wrap(graph_outputs, "export_models", "write_caffe_outputs")
    wrap(oneshot, "calibration_batches", "data_setup")
    wrap(oneshot, "run_calibration", "calibration")
    wrap(oneshot, "check_records", "records")
    wrap(oneshot, "write_records", "record_write")
    wrap(oneshot, "fake_quant_graph", "fake_quant_graph")
    wrap(oneshot, "_move", "move_outputs")
    import amct_torch.quality.report as report
    wrap(report, "layer_report", "report")
    wrap(report, "write_report", "report_write")
    t = time.perf_counter()
    rc = cli.main(argv)
    times["cli_main"] = time.perf_counter() - t
    times["total_in_process"] = time.perf_counter() - t0
    print(json.dumps({k: round(v, 3) for k, v in times.items()}))
    sys.exit(rc)


# ----- driver --------------------------------------------------------------------------------

def median(rows: list[dict], key: str) -> float:
    return round(statistics.median(r[key] for r in rows), 3)


def bench_size(proto: str, weights: str, float_onnx: str, work: str, n: int, batch: int,
               repeats: int, report: bool) -> None:
    images = os.path.join(work, f"images_{n}")
    if not os.path.isdir(images):
        make_images(images, n)
    out = os.path.join(work, f"out_{n}")
    jobs = {"ours": ours_cmd(proto, weights, images, batch, n, os.path.join(out, "m"), False),
            "ort_minmax": [sys.executable, __file__, "--child-ort", float_onnx, images, str(batch),
                           os.path.join(out, "ort_quant.onnx")]}
    if report:
        jobs["ours_report"] = ours_cmd(proto, weights, images, batch, n, os.path.join(out, "r"), True)
    names = list(jobs)
    rows: dict[str, list[dict]] = {k: [] for k in names}
    for r in range(repeats):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            shutil.rmtree(out, ignore_errors=True)
            os.makedirs(out)
            res = run_child(jobs[name])
            res.pop("stdout")
            rows[name].append(res)
            emit(metric="job", images=n, batch=batch, job=name, rep=r,
                 loadavg_1min=round(os.getloadavg()[0], 2), **res)
    summ: dict[str, Any] = {"metric": "summary", "images": n, "batch": batch, "repeats": repeats}
    for name in names:
        for key in ("wall_s", "user_s", "sys_s", "cpu_s", "peak_rss_mib"):
            summ[f"{name}_{key}"] = median(rows[name], key)
        summ[f"{name}_sys_share"] = round(summ[f"{name}_sys_s"] / max(summ[f"{name}_cpu_s"], 1e-9), 3)
    for key in ("wall_s", "cpu_s", "peak_rss_mib"):
        summ[f"ratio_ours_ort_{key}"] = round(summ[f"ours_{key}"] / summ[f"ort_minmax_{key}"], 3)
        if report:
            summ[f"ratio_report_on_off_{key}"] = round(summ[f"ours_report_{key}"] / summ[f"ours_{key}"], 3)
    emit(**summ)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    argv = ours_cmd(proto, weights, images, batch, n, os.path.join(out, "p"), False)[1:]
    res = run_child([sys.executable, __file__, "--child-phases", *argv])
    phases = json.loads(res.pop("stdout").strip().splitlines()[-1])
    emit(metric="phases", images=n, batch=batch, note="one instrumented run, seconds", **phases,
         wall_s=res["wall_s"])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child-ort":
        ort_child(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--child-phases":
        phases_child(sys.argv[2:])
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sizes", default="32x8,256x32", help="images x batch, comma-separated")
    ap.add_argument("--no-report", action="store_true", help="skip the report-on job")
    ap.add_argument("--work", help="working folder (default: a temporary one, removed at the end)")
    args = ap.parse_args()
    proto, weights = nsfw_files()
    work = args.work or tempfile.mkdtemp(prefix="bench_job_")
    try:
        os.makedirs(work, exist_ok=True)
        float_onnx = os.path.join(work, "nsfw_float.onnx")
        if not os.path.exists(float_onnx):
            # the project's own float ONNX export of the BN-fused model (one small calibration)
            make_images(os.path.join(work, "images_8"), 8)
            run_child(ours_cmd(proto, weights, os.path.join(work, "images_8"), 8, 8,
                               os.path.join(work, "export", "m"), False) + ["--onnx"])
            shutil.copyfile(os.path.join(work, "export", "m_float.onnx"), float_onnx)
        emit(metric="setup", cpus=os.cpu_count(), loadavg_1min=round(os.getloadavg()[0], 2),
             note="the jobs alternate; ratios are of medians from this one run")
        for spec in args.sizes.split(","):
            n, batch = (int(v) for v in spec.lower().split("x"))
            bench_size(proto, weights, float_onnx, work, n, batch, args.repeats, not args.no_report)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
