"""End-to-end job benchmark: the real ``amct-torch calibrate`` command against ONNX Runtime's own
quantizer (``quantize_static``, MinMax, QDQ, per-channel) on the same model and images.

Why: users judge the tool by the whole command (import, load the Caffe model, fuse, ARQ,
calibrate, write the record and every model), not by a kernel. Each job runs as its own child
process; ``os.wait4`` gives that child's wall time, user and system CPU time and peak RSS. The
two jobs alternate (the order flips every repetition) so that load on a shared machine hits
both alike, and the ratios are taken from medians of the same run.

Models (``--models``): ``nsfw``, the nsfw package's Caffe ResNet-50-1by2 (24 MB); ``vgg16``,
the real VGG-16 architecture (13 convolutions, 3 InnerProducts, 138 M parameters) written as a
prototxt by ``vgg16_prototxt`` with seeded random weights written as a 553 MB caffemodel into
the working folder (built by code, never committed): the size of model whose weights, not
whose calibration, dominate a job. Images: natural photographs from scikit-image and
scikit-learn, cropped and flipped at random (seeded) into distinct 256×256 JPEGs; both jobs
resize to 256 on the shorter side, centre-crop 224 and subtract the mean 104,117,123 (BGR, as
Caffe). ORT quantizes the project's own float ONNX export of the same BN-fused model.

Printed (JSON lines): per model and size (32 images at batch 8, 256 at batch 32) one ``job``
row per job and repetition, a ``summary`` row with medians and ratios (ours / ORT; report on /
off; with ``--onnx``), and a ``phases`` row: per phase of our job (the job's own progress
phases) its seconds, user and system CPU seconds, the process's RSS at its end and its peak
RSS so far, in one extra instrumented run. The VGG-16 case also prints the caffemodel's size and the peak / caffemodel
ratio.

Run: .venv/bin/python benchmarks/bench_job.py [--repeats 3] [--sizes 32x8,256x32]
     .venv/bin/python benchmarks/bench_job.py --models vgg16 --sizes 32x8 --repeats 1 --no-report
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


#: a small Python that starts the job and reports its rusage: Linux records the peak RSS of the
#: process that exec()s a command as at least the RSS of the memory it was forked from, so a
#: job started straight from this (large) benchmark process would report the benchmark's own
#: RSS as its peak; started from this ~10 MB launcher, the figure is the job's own
_LAUNCHER = """
import json, os, sys, time
fd, cmd = int(sys.argv[1]), json.loads(sys.argv[2])
t = time.perf_counter()
pid = os.posix_spawnp(cmd[0], cmd, os.environ)
_, status, ru = os.wait4(pid, 0)
os.write(fd, json.dumps({"wall": time.perf_counter() - t, "status": status, "utime": ru.ru_utime,
                         "stime": ru.ru_stime, "maxrss": ru.ru_maxrss}).encode())
"""


def run_child(cmd: list[str], env: Optional[dict] = None) -> dict:
    """Run ``cmd`` to the end through ``_LAUNCHER``; its wall time and its own rusage (user,
    system, peak RSS), as ``os.wait4`` gives them for exactly that child."""
    r, w = os.pipe()
    with tempfile.TemporaryFile() as fout, tempfile.TemporaryFile() as ferr:
        try:
            launcher = subprocess.Popen([sys.executable, "-S", "-c", _LAUNCHER, str(w), json.dumps(cmd)],
                                        stdout=fout, stderr=ferr, env=env, pass_fds=(w,))
        finally:
            os.close(w)
        with os.fdopen(r) as f:
            report = f.read()
        launcher.wait()
        fout.seek(0)
        ferr.seek(0)
        out, err = fout.read(), ferr.read()
    if launcher.returncode != 0 or not report:
        raise SystemExit(f"{cmd[:4]}: the launcher failed ({launcher.returncode}):\n{err.decode()[-3000:]}")
    ru = json.loads(report)
    code = os.waitstatus_to_exitcode(ru["status"])
    if code != 0:
        raise SystemExit(f"{cmd[:4]} failed ({code}):\n{err.decode()[-3000:]}")
    return {"wall_s": round(ru["wall"], 3), "user_s": round(ru["utime"], 3), "sys_s": round(ru["stime"], 3),
            "cpu_s": round(ru["utime"] + ru["stime"], 3), "peak_rss_mib": round(ru["maxrss"] / 1024, 1),
            "stdout": out.decode(errors="replace")}


def ours_cmd(proto: str, weights: str, images: str, batch: int, n: int, out: str,
             report: bool, extra: tuple = (), onnx: bool = False) -> list[str]:
    exe = os.path.join(os.path.dirname(sys.executable), "amct-torch")
    return [exe, *extra, "calibrate", proto, weights, images, "--mean", ",".join(str(int(m)) for m in MEAN),
            "--resize", "256", "--crop", "224", "--batch-size", str(batch), "--batch-num", str(n // batch),
            "--device", "cpu", "-q", "--report-batches", "2" if report else "0", "--output", out,
            *(["--onnx"] if onnx else [])]


# ----- the VGG-16-sized model, built by code -------------------------------------------------

#: VGG-16's convolution stages: (output channels, convolutions) per stage, 3x3 pad 1, each
#: stage closed by a 2x2 stride-2 max pooling; then fc6 4096, fc7 4096, fc8 1000, softmax
VGG16_STAGES = ((64, 2), (128, 2), (256, 3), (512, 3), (512, 3))


def vgg16_layers() -> list[tuple[str, str, list[int]]]:
    """(layer name, type, weight shape or []) of VGG-16 in order (Caffe's VGG_ILSVRC_16 names)."""
    out: list[tuple[str, str, list[int]]] = []
    c_in = 3
    for s, (c, n) in enumerate(VGG16_STAGES, start=1):
        for k in range(1, n + 1):
            out += [(f"conv{s}_{k}", "Convolution", [c, c_in, 3, 3]), (f"relu{s}_{k}", "ReLU", [])]
            c_in = c
        out.append((f"pool{s}", "Pooling", []))
    k_in = c_in * 7 * 7
    for name, n in (("fc6", 4096), ("fc7", 4096), ("fc8", 1000)):
        out.append((name, "InnerProduct", [n, k_in]))
        if name != "fc8":
            out += [(f"relu{name[2:]}", "ReLU", []), (f"drop{name[2:]}", "Dropout", [])]
        k_in = n
    out.append(("prob", "Softmax", []))
    return out


def vgg16_prototxt() -> str:
    """The deploy prototxt of VGG-16 (one 1x3x224x224 input ``data``; in-place ReLU/Dropout)."""
    lines = ['name: "VGG_ILSVRC_16_layers"', 'input: "data"',
             "input_shape { dim: 1 dim: 3 dim: 224 dim: 224 }"]
    blob = "data"
    for name, kind, shape in vgg16_layers():
        top = blob if kind in ("ReLU", "Dropout") else name
        body = ""
        if kind == "Convolution":
            body = f"convolution_param {{ num_output: {shape[0]} pad: 1 kernel_size: 3 }}"
        elif kind == "Pooling":
            body = "pooling_param { pool: MAX kernel_size: 2 stride: 2 }"
        elif kind == "InnerProduct":
            body = f"inner_product_param {{ num_output: {shape[0]} }}"
        elif kind == "Dropout":
            body = "dropout_param { dropout_ratio: 0.5 }"
        lines.append(f'layer {{ name: "{name}" type: "{kind}" bottom: "{blob}" top: "{top}" {body} }}')
        blob = top
    return "\n".join(lines) + "\n"


def write_vgg16(folder: str, seed: int = 0) -> tuple[str, str]:
    """``vgg16_deploy.prototxt`` and a caffemodel of seeded random weights (He-scaled normal,
    so activations keep their size through the 16 layers; biases small) in ``folder``. The
    caffemodel is written layer by layer: a NetParameter is the concatenation of its fields,
    so each ``layer`` (field 100) goes out as soon as it is made."""
    import numpy as np

    from amct_torch.files.protowire import field_key, varint
    from amct_torch.proto import amct_caffe_pb2 as pb

    proto, weights = os.path.join(folder, "vgg16_deploy.prototxt"), os.path.join(folder, "vgg16.caffemodel")
    if os.path.exists(proto) and os.path.exists(weights):
        return proto, weights
    with open(proto, "w") as f:
        f.write(vgg16_prototxt())
    rng = np.random.default_rng(seed)
    with open(weights + ".part", "wb") as f:
        for name, kind, shape in vgg16_layers():
            layer = pb.LayerParameter(name=name, type=kind)
            if shape:
                fan_in = int(np.prod(shape[1:]))
                w = rng.standard_normal(shape, dtype=np.float32) * np.float32(np.sqrt(2.0 / fan_in))
                b = rng.uniform(-0.05, 0.05, shape[0]).astype(np.float32)
                for arr in (w, b):
                    blob = layer.blobs.add()
                    blob.shape.dim.extend(arr.shape)
                    raw = arr.astype("<f4").tobytes()
                    blob.MergeFromString(field_key(5) + varint(len(raw)) + raw)
            data = layer.SerializeToString()
            f.write(field_key(100) + varint(len(data)) + data)
    os.replace(weights + ".part", weights)
    return proto, weights


# ----- ORT child ---------------------------------------------------------------------------

def ort_child(float_onnx: str, images: str, batch: int, out: str) -> None:
    """ONNX Runtime's static quantization of ``float_onnx``: MinMax, QDQ, per-channel weights,
    fed the same preprocessed images in batches of ``batch``."""
    import cv2
    import numpy as np
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, quantize_static

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
        from amct_torch.runtime.threads import prefer_passive_waits
        prefer_passive_waits()
    except ImportError:  # an older revision
        pass
    try:
        from amct_torch.runtime.malloc_tuning import keep_freed_memory
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
    import amct_torch.export.caffe.exporter as caffe_exporter
    wrap(netio, "read_net", "load_read_net")
    wrap(graph, "build_graph", "load_build_graph")
    wrap(oneshot, "_config_json", "config_json")
    wrap(oneshot, "load", "load_total")
    wrap(oneshot, "quantize_weights", "fuse_arq")
    wrap(caffe_exporter, "write_caffe_models", "write_caffe_outputs")
    wrap(oneshot, "calibration_batches", "data_setup")
    wrap(oneshot, "run_calibration", "calibration")
    wrap(oneshot, "check_records", "records")
    wrap(oneshot, "write_records", "record_write")
    wrap(oneshot, "fake_quant_graph", "fake_quant_graph")
    wrap(oneshot, "_move", "move_outputs")
    import amct_torch.quality.report as report
    wrap(report, "layer_report", "report")
    wrap(report, "write_report", "report_write")
    # the job's own progress phases, each with the RSS at its end and the peak so far (MiB)
    import resource

    import amct_torch.runtime.progress as progress
    end = progress.JobProgress._end
    job_phases: list[dict] = []

    last_cpu = [0.0, 0.0]

    def _end(self: Any) -> None:
        name, t0 = self._name, self._t0
        end(self)
        ru = resource.getrusage(resource.RUSAGE_SELF)
        if name is not None:
            with open("/proc/self/statm") as f:
                rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20
            job_phases.append({"phase": name, "s": round(time.perf_counter() - t0, 3),
                               "user_s": round(ru.ru_utime - last_cpu[0], 3),
                               "sys_s": round(ru.ru_stime - last_cpu[1], 3),
                               "rss_mib": round(rss, 1),
                               "peak_mib": round(ru.ru_maxrss / 1024, 1)})
        last_cpu[:] = [ru.ru_utime, ru.ru_stime]

    start = progress.JobProgress.start

    def _start(self: Any, name: str) -> None:
        if self._name is None:  # the first phase: CPU time from here (the imports are counted apart)
            ru = resource.getrusage(resource.RUSAGE_SELF)
            last_cpu[:] = [ru.ru_utime, ru.ru_stime]
        start(self, name)
    progress.JobProgress.start = _start
    progress.JobProgress._end = _end
    t = time.perf_counter()
    rc = cli.main(argv)
    times["cli_main"] = time.perf_counter() - t
    times["total_in_process"] = time.perf_counter() - t0
    out = {k: round(v, 3) for k, v in times.items()}
    out["job_phases"] = job_phases  # type: ignore[assignment]
    print(json.dumps(out))
    sys.exit(rc)


# ----- driver --------------------------------------------------------------------------------

def median(rows: list[dict], key: str) -> float:
    return round(statistics.median(r[key] for r in rows), 3)


def bench_size(model: str, proto: str, weights: str, float_onnx: str, work: str, n: int, batch: int,
               repeats: int, report: bool, plain: bool) -> None:
    """One model and size: the jobs alternating ``repeats`` times, their summary, then the
    phases of one instrumented ``--onnx`` run. ``plain``: also our job without ``--onnx``."""
    images = os.path.join(work, f"images_{n}")
    if not os.path.isdir(images):
        make_images(images, n)
    out = os.path.join(work, f"out_{n}")
    jobs = {"ours_onnx": ours_cmd(proto, weights, images, batch, n, os.path.join(out, "o"), False, onnx=True),
            "ort_minmax": [sys.executable, __file__, "--child-ort", float_onnx, images, str(batch),
                           os.path.join(out, "ort_quant.onnx")]}
    if plain:
        jobs["ours"] = ours_cmd(proto, weights, images, batch, n, os.path.join(out, "m"), False)
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
            emit(metric="job", model=model, images=n, batch=batch, job=name, rep=r,
                 loadavg_1min=round(os.getloadavg()[0], 2), **res)
    summ: dict[str, Any] = {"metric": "summary", "model": model, "images": n, "batch": batch,
                            "repeats": repeats, "caffemodel_mib": round(os.path.getsize(weights) / 2 ** 20, 1)}
    for name in names:
        for key in ("wall_s", "user_s", "sys_s", "cpu_s", "peak_rss_mib"):
            summ[f"{name}_{key}"] = median(rows[name], key)
        summ[f"{name}_sys_share"] = round(summ[f"{name}_sys_s"] / max(summ[f"{name}_cpu_s"], 1e-9), 3)
        if name.startswith("ours"):
            summ[f"{name}_peak_per_caffemodel"] = round(summ[f"{name}_peak_rss_mib"] / summ["caffemodel_mib"], 3)
    for key in ("wall_s", "cpu_s", "peak_rss_mib"):
        summ[f"ratio_ours_onnx_ort_{key}"] = round(summ[f"ours_onnx_{key}"] / summ[f"ort_minmax_{key}"], 3)
        if plain:
            summ[f"ratio_ours_ort_{key}"] = round(summ[f"ours_{key}"] / summ[f"ort_minmax_{key}"], 3)
        if report and plain:
            summ[f"ratio_report_on_off_{key}"] = round(summ[f"ours_report_{key}"] / summ[f"ours_{key}"], 3)
    emit(**summ)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    argv = jobs["ours_onnx"][1:]
    res = run_child([sys.executable, __file__, "--child-phases", *argv])
    phases = json.loads(res.pop("stdout").strip().splitlines()[-1])
    emit(metric="phases", model=model, images=n, batch=batch, onnx=True,
         note="one instrumented run: seconds per wrapped call; job_phases: the job's progress "
              "phases with wall and CPU seconds, RSS at their end and peak so far (MiB)", **phases,
         wall_s=res["wall_s"], peak_rss_mib=res["peak_rss_mib"])


def model_files(model: str, work: str) -> tuple[str, str]:
    """The prototxt and caffemodel of ``model`` (``vgg16`` is written into ``work`` once)."""
    if model == "nsfw":
        return nsfw_files()
    if model == "vgg16":
        return write_vgg16(work)
    raise SystemExit(f"unknown model {model!r} (nsfw, vgg16)")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child-ort":
        ort_child(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--child-phases":
        phases_child(sys.argv[2:])
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--models", default="nsfw,vgg16", help="nsfw and/or vgg16, comma-separated")
    ap.add_argument("--sizes", default="32x8,256x32", help="images x batch, comma-separated")
    ap.add_argument("--no-report", action="store_true", help="skip the report-on job")
    ap.add_argument("--no-plain", action="store_true", help="skip our job without --onnx")
    ap.add_argument("--work", help="working folder (default: a temporary one, removed at the end)")
    args = ap.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="bench_job_")
    try:
        os.makedirs(work, exist_ok=True)
        emit(metric="setup", cpus=os.cpu_count(), loadavg_1min=round(os.getloadavg()[0], 2),
             note="the jobs alternate; ratios are of medians from this one run")
        for model in args.models.split(","):
            proto, weights = model_files(model, work)
            float_onnx = os.path.join(work, f"{model}_float.onnx")
            if not os.path.exists(float_onnx):
                # the project's own float ONNX export of the BN-fused model (one small calibration)
                make_images(os.path.join(work, "images_8"), 8)
                run_child(ours_cmd(proto, weights, os.path.join(work, "images_8"), 8, 8,
                                   os.path.join(work, "export", model), False, onnx=True))
                shutil.copyfile(os.path.join(work, "export", f"{model}_float.onnx"), float_onnx)
                shutil.rmtree(os.path.join(work, "export"), ignore_errors=True)
            for spec in args.sizes.split(","):
                n, batch = (int(v) for v in spec.lower().split("x"))
                bench_size(model, proto, weights, float_onnx, work, n, batch, args.repeats,
                           not args.no_report and model == "nsfw", not args.no_plain)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
