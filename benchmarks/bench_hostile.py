"""Trust under faults and hostile files: prints JSON lines.

* ``hostile_inputs``: the hand-written cases of tests/helpers/hostile_cases.py plus generated ones
  (cuts of the example caffemodel, prototxt, record and quant.cfg at many points, byte flips),
  each through the CLI and through the API in a memory-limited child (2.5 GB address space);
  ``clean`` = exit 2 with one line naming one of the case's input files (or a success where
  the generated input is still valid, and for a rerun exactly that run's files left beside
  the user's: FIFOs, byte orders, absurd counts, reruns over an earlier set, damaged staging
  manifests are among the cases); anything else is counted in ``not_clean``.
  ``by_class`` gives cases and clean ones per class (output paths, dropped options, evaluate,
  records, data ... as in tests/helpers/hostile_cases.py).
* ``api_arguments``: every exported function with wrong argument types and values
  (tests/helpers/api_misuse.py): an AmctError naming the argument, nothing written.
* ``commit_failures``: a commit that cannot replace an earlier output (each link or rename
  position failing, and a real CLI rerun over an immutable earlier file): the earlier set kept.
* ``printing``: a finished run with a unicode prefix under ``LANG=C PYTHONIOENCODING=ascii``.
* ``fuzz``: seeded random mutations fed straight to each reader (prototxt, caffemodel,
  quant.cfg, JSON, record, .npy/.npz, image): how many, how many raised the right error, how
  many escaped with another exception.
* ``kills``: SIGKILL of a real CLI ``calibrate`` over an earlier run's outputs at steps of
  writing/committing and after delays (during calibration), with the temp folder on a tmpfs
  (/dev/shm) and on the output's filesystem; after each, the folder must hold one complete run
  (after the recovery the next command runs first); ``torn_or_mixed`` must be 0.
* ``peak_memory``: max RSS of a normal example calibration vs each small hostile file that
  used to allocate gigabytes, each in a fresh process.
* ``text_prepass``: the quant.cfg/record pre-pass on a quote followed by escaped quotes,
  20/40/80 KB, against the regular expression it replaced.

Run: PYTHONPATH=. python benchmarks/bench_hostile.py [--kills N] [--fuzz N]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, ROOT)

import helpers.hostile_cases as hc  # noqa: E402


def emit(**kw) -> None:
    print(json.dumps(kw), flush=True)


def generated_cases(folder: str) -> list:
    """Cuts and byte flips of the example's files: distinct inputs, valid or not."""
    rng = random.Random(16)
    cases = []
    weights = hc.weights_bytes()
    model = hc.model_text().encode()
    record = hc.record_texts()["scale_d_1e-30"].replace("1e-30", "0.01").encode()
    cfg = hc.quant_cfg_texts()["search_step_1e-9"].replace("1e-9", "0.01").encode()
    os.makedirs(folder, exist_ok=True)

    def add(kind, name, blob, make_argv, names, or_names=""):
        p = os.path.join(folder, name)
        with open(p, "wb") as f:
            f.write(blob)
        cases.append(hc.Case(f"gen/{kind}/{name}", kind, make_argv(p), p, or_names=or_names))

    for k in sorted(rng.sample(range(1, len(weights)), 40)):
        add("caffemodel", f"w_cut{k}.caffemodel", weights[:k], lambda p: hc._calibrate(weights=p), None,
            hc.MODEL)
    for k in sorted(rng.sample(range(1, len(model)), 25)):
        add("prototxt", f"m_cut{k}.prototxt", model[:k], lambda p: hc._calibrate(p), None, hc.WEIGHTS)
    for k in sorted(rng.sample(range(1, len(record)), 20)):
        add("record", f"r_cut{k}.txt", record[:k], lambda p: hc._convert(p), None, hc.MODEL)
    for k in sorted(rng.sample(range(1, len(cfg)), 15)):
        add("quant_cfg", f"q_cut{k}.cfg", cfg[:k], lambda p: hc._config(hc.MODEL, hc.WEIGHTS, "--quant-cfg", p),
            None)
    for i in range(20):
        b = bytearray(weights)
        for _ in range(4):
            b[rng.randrange(len(b))] = rng.randrange(256)
        add("caffemodel", f"w_flip{i}.caffemodel", bytes(b), lambda p: hc._calibrate(weights=p), None, hc.MODEL)
    return cases


def clean(case, result) -> bool:
    if result["traceback"] or "Traceback" in result["stderr"]:
        return False
    if result["rc"] == 0:  # an accepted case must also leave exactly its run's files
        return case.name.startswith("gen/") or (case.expect_ok and not hc.problems(case, result))
    return not hc.problems(case, result) or (
        case.name.startswith("gen/") and result["rc"] == 2 and len(result["stderr"].splitlines()) == 1
        and any(n and n in result["stderr"] for n in (case.names, case.or_names, hc.MODEL, hc.WEIGHTS, hc.DATA))
        and not result["left"])


def bench_hostile(work: str) -> None:
    cases = hc.all_cases(os.path.join(work, "hand")) + generated_cases(os.path.join(work, "gen"))
    for c in cases:
        if not c.out:
            c.out = os.path.join(work, "out", c.name.replace("/", "_"), "m")
    for mode in ("cli", "api"):
        t = time.time()
        results = hc.run_cases(cases, work, mode=mode)
        bad = [c.name for c, r in zip(cases, results) if not clean(c, r)]
        by_class: dict = {}
        for c in cases:
            counts = by_class.setdefault(c.kind, {"cases": 0, "clean": 0})
            counts["cases"] += 1
            counts["clean"] += c.name not in bad
        emit(metric="hostile_inputs", mode=mode, distinct=len({c.name for c in cases}), by_class=by_class,
             hand_written=sum(not c.name.startswith("gen/") for c in cases),
             generated=sum(c.name.startswith("gen/") for c in cases),
             errors=sum(r["rc"] == 2 for r in results), accepted=sum(r["rc"] == 0 for r in results),
             clean=len(cases) - len(bad), not_clean=len(bad), not_clean_cases=bad[:20],
             seconds=round(time.time() - t, 1))


def bench_api_arguments(work: str) -> None:
    """Every exported function with wrong arguments (tests/helpers/api_misuse.py): clean = an
    AmctError naming the argument, one line, nothing written."""
    from amct_torch.errors import AmctError
    from helpers.api_misuse import call, rows
    clean_n, bad = 0, []
    for _i, (name, args, kwargs, arg) in enumerate(rows(os.path.join(work, "api_args"))):
        folder = os.path.join(work, "api_args")
        try:
            call(name, args, kwargs)
            bad.append(f"{name}({arg}): accepted")
        except AmctError as err:
            ok = arg in str(err) and "\n" not in str(err) and not os.path.exists(folder)
            clean_n += ok
            if not ok:
                bad.append(f"{name}({arg}): {str(err)[:80]}")
        except Exception as err:  # noqa: BLE001 - counted
            bad.append(f"{name}({arg}): {type(err).__name__}")
    emit(metric="api_arguments", cases=clean_n + len(bad), clean=clean_n, not_clean=len(bad), examples=bad[:5])


def bench_commit_failures(work: str) -> None:
    """A rerun whose commit cannot replace an earlier output: through the CLI over an immutable
    earlier file (chattr +i, where the filesystem has it), and in-process with the rename of each
    position failing; clean = exit 2 / AmctError saying the earlier set was kept, every earlier
    file unchanged, no staging folder left."""
    import errno
    import subprocess

    from amct_torch.errors import AmctError
    from amct_torch.files.transaction import staging_folder
    kept = total = 0
    cases = []
    sys.path.insert(0, os.path.join(ROOT, "tests", "hostile"))  # the rollback test's own sets
    from test_commit_rollback import _old_set, _staged_new
    for call_name in ("link", "replace"):
        for n in range(1, 5):
            prefix = os.path.join(work, "commit", f"{call_name}{n}", "m")
            os.makedirs(os.path.dirname(prefix), exist_ok=True)
            finals = _old_set(prefix)
            tx = _staged_new(finals)
            real, calls = getattr(os, call_name), []

            # a link refused as an immutable file refuses it; a rename failing with an I/O error
            code = errno.EPERM if call_name == "link" else errno.EIO

            def failing(src, dst, *a, _real=real, _n=n, _calls=calls, _code=code, **k):
                _calls.append(dst)
                if len(_calls) == _n:
                    raise OSError(_code, os.strerror(_code), dst)
                return _real(src, dst, *a, **k)
            setattr(os, call_name, failing)
            try:
                tx.commit()
                ok = False  # the fault never fired (fewer calls than n): not a case
                continue
            except AmctError as err:
                ok = "previous outputs were kept" in str(err)
            finally:
                setattr(os, call_name, real)
                tx.abort()
            total += 1
            ok = ok and all(open(p).read() == "old" for p in finals) and not os.path.exists(staging_folder(prefix))
            kept += ok
            cases.append(f"{call_name}#{n}:{'kept' if ok else 'MIXED'}")
    cli = "not run"
    if shutil.which("chattr"):
        prefix = os.path.join(work, "commit", "immutable", "m")
        args = [sys.executable, "-m", "amct_torch.cli", *[a.replace("{out}", prefix) for a in hc._calibrate()]]
        env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
        subprocess.run(args, env=env, capture_output=True, timeout=600, check=True)
        victim = prefix + "_deploy_weights.caffemodel"
        before = {n: open(os.path.join(os.path.dirname(prefix), n), "rb").read()
                  for n in os.listdir(os.path.dirname(prefix))}
        if subprocess.run(["chattr", "+i", victim], capture_output=True).returncode == 0:
            try:
                r = subprocess.run(args + ["--batch-num", "2"], env=env, capture_output=True, text=True, timeout=600)
            finally:
                subprocess.run(["chattr", "-i", victim])
            after = {n: open(os.path.join(os.path.dirname(prefix), n), "rb").read()
                     for n in os.listdir(os.path.dirname(prefix))}
            good = r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and after == before \
                and "previous outputs were kept" in r.stderr
            total += 1
            kept += good
            cli = "kept" if good else f"MIXED (exit {r.returncode}: {r.stderr.strip()[-120:]})"
        else:
            cli = "chattr unsupported on this filesystem"
    emit(metric="commit_failures", cases=total, kept_old_set=kept, mixed=total - kept, cli_immutable=cli,
         injected=cases)


def bench_printing(work: str) -> None:
    """A finished run with a unicode prefix under LANG=C PYTHONIOENCODING=ascii: exit 0."""
    import subprocess
    prefix = os.path.join(work, "print", "r\u00e9sum\u00e9", "m")
    args = [sys.executable, "-m", "amct_torch.cli", *[a.replace("{out}", prefix) for a in hc._calibrate()]]
    env = dict(os.environ, PYTHONPATH=ROOT, LANG="C", LC_ALL="C", PYTHONIOENCODING="ascii",
               OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    r = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
    emit(metric="printing", cases=1, clean=int(r.returncode == 0 and "written:" in r.stdout),
         exit=r.returncode)


def bench_fuzz(work: str, n: int) -> None:
    """Seeded mutations straight into each reader."""
    import io

    import numpy as np

    from amct_torch.caffe.netio import read_net
    from amct_torch.config import parse_quant_cfg, read_quant_config_json, resolve_quant_cfg
    from amct_torch.config.create import model_layer_infos
    from amct_torch.errors import AmctError
    from amct_torch.inputs.data import Preprocess, calibration_batches, load_image
    from amct_torch.record import read_record, validate_record
    layers = model_layer_infos(hc.MODEL)
    buf = io.BytesIO()
    np.save(buf, np.zeros((2, 1, 16, 16), np.float32))
    npy = buf.getvalue()
    cfg_json = os.path.join(work, "good.json")
    import amct_torch
    amct_torch.create_quant_config(cfg_json, hc.MODEL, hc.WEIGHTS)
    readers = {
        "prototxt": (hc.model_text().encode(), ".prototxt", lambda p: read_net(p)),
        "caffemodel": (hc.weights_bytes(), ".caffemodel", lambda p: read_net(hc.MODEL, p)),
        "quant_cfg": (hc.quant_cfg_texts()["search_step_1e-9"].replace("1e-9", "0.01").encode(), ".cfg",
                      lambda p: resolve_quant_cfg(parse_quant_cfg(p), layers, p)),
        "json": (open(cfg_json, "rb").read(), ".json", lambda p: read_quant_config_json(p, layers)),
        "record": (hc.record_texts()["scale_d_1e-30"].replace("1e-30", "0.01").encode(), ".txt",
                   lambda p: validate_record(read_record(p), layers, p)),
        "npy": (npy, ".npy", lambda p: list(calibration_batches(p, [("data", [1, 1, 16, 16])], 2))),
        "npz": (hc.zipfile_bytes({"inputs.npy": npy}), ".npz",
                lambda p: list(calibration_batches(p, [("data", [1, 1, 16, 16])], 2))),
        "png": (hc._png(16, 16, b"\0" * (17 * 16)), ".png", lambda p: load_image(p, Preprocess(), 1, (16, 16))),
    }
    rng = random.Random(1616)
    for name, (base, ext, call) in readers.items():
        ok = errors = escaped = 0
        examples = []
        for _i in range(n):
            b = bytearray(base)
            how = rng.randrange(3)
            if how == 0:
                b = b[:rng.randrange(len(b))]
            elif how == 1:
                for _ in range(rng.randint(1, 8)):
                    b[rng.randrange(len(b))] = rng.randrange(256)
            else:
                k = rng.randrange(len(b))
                b[k:k] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 32)))
            p = os.path.join(work, f"fuzz{ext}")
            with open(p, "wb") as f:
                f.write(bytes(b))
            try:
                call(p)
                ok += 1
            except AmctError:
                errors += 1
            except Exception as err:  # noqa: BLE001 - counted
                escaped += 1
                examples.append(f"{type(err).__name__}: {str(err)[:80]}")
        emit(metric="fuzz", reader=name, inputs=n, accepted=ok, clean_errors=errors,
             escaped=escaped, examples=examples[:3])


def bench_kills(work: str, per_layout: int) -> None:
    sys.path.insert(0, os.path.join(ROOT, "tests", "hostile"))  # the kill test's own checks
    from test_kill_outputs import _args, _env, _other_fs_tmp, check_after_kill

    from helpers.kill import final_set, run_cli
    refs = {}
    tmp0 = os.path.join(work, "kill_tmp0")
    os.makedirs(tmp0, exist_ok=True)
    for name, batches in (("a", 1), ("b", 2)):
        prefix = os.path.join(work, "kill_ref", name, "m")
        count = os.path.join(work, f"kill_{name}.n")
        assert run_cli(_args(prefix, batches), _env(tmp0), count_file=count) == 0
        refs[name] = final_set(prefix)
        refs[name + "_steps"] = int(open(count).read())
    steps = refs["b_steps"]
    rng = random.Random(9)
    for layout in ("other_fs", "same_fs"):
        out_root = os.path.join(work, f"kills_{layout}")
        os.makedirs(out_root)
        tmp = _other_fs_tmp(work, out_root) if layout == "other_fs" else os.path.join(out_root, "tmp")
        os.makedirs(tmp, exist_ok=True)
        timed = max(2, per_layout // 6)
        points = sorted(rng.sample(range(1, steps + 1), min(steps, per_layout - timed)))
        survived = torn = 0
        outcomes = {"old": 0, "new": 0}
        t = time.time()
        for i, k in enumerate(points + [None] * timed):
            prefix = os.path.join(out_root, f"k{i}", "m")
            shutil.copytree(os.path.dirname(os.path.join(work, "kill_ref", "a", "m")), os.path.dirname(prefix))
            if k is None:
                run_cli(_args(prefix, 2), _env(tmp), kill_after_s=rng.uniform(2.0, 5.0))
            else:
                run_cli(_args(prefix, 2), _env(tmp), kill_at=k)
            try:
                outcomes[check_after_kill(prefix, refs["a"], refs["b"], tmp)] += 1
                survived += 1
            except AssertionError:
                torn += 1
        fs = "tmpfs" if tmp.startswith("/dev/shm") else "second folder, same filesystem"
        emit(metric="kills", layout=layout, temp_folder=fs, kills=len(points) + timed,
             at_write_steps=len(points), during_calibration=timed, write_steps=steps,
             survived=survived, torn_or_mixed=torn, left_old_set=outcomes["old"],
             left_new_set=outcomes["new"], seconds=round(time.time() - t, 1))
        if tmp.startswith("/dev/shm"):
            shutil.rmtree(tmp, ignore_errors=True)


def bench_memory(work: str) -> None:
    folder = os.path.join(work, "mem")
    cases = {c.name: c for c in hc.all_cases(folder)}
    normal = hc.Case("normal", "normal", hc._calibrate(), hc.DATA, expect_ok=True,
                     out=os.path.join(folder, "normal", "m"))
    names = ["data/npz_bomb_1gb_default_batch", "data/images/png_100000", "data/npy_header_1e12",
             "data/images/declared_100000_input", "quant_cfg/search_step_1e-9",
             "quant_cfg/search_range_end_1e30", "prototxt/dims_2pow32", "json/int_5000_digits",
             "prototxt/pad_1200_fully_convolutional", "prototxt/layers_over_limit",
             "caffemodel/empty_layers_7mb", "caffemodel/fp16_shrunk", "data/npy_be_f8",
             "data/npz_100000_members"]
    # the largest image still accepted (just under MAX_IMAGE_PIXELS), a ~50 KB PNG
    from amct_torch.inputs.data import MAX_IMAGE_PIXELS
    side = int(MAX_IMAGE_PIXELS ** 0.5) - 1
    big_dir = os.path.join(folder, "largest_allowed_image")
    os.makedirs(big_dir, exist_ok=True)
    with open(os.path.join(big_dir, "a.png"), "wb") as f:
        f.write(hc._png(side, side, all_rows=True))
    cases["data/largest_allowed_png"] = hc.Case("data/largest_allowed_png", "data",
                                                hc._calibrate(hc.MODEL, hc.WEIGHTS, big_dir),
                                                big_dir, expect_ok=True,
                                                out=os.path.join(folder, "big", "m"))
    names.append("data/largest_allowed_png")
    peaks = {}
    for c in [normal] + [cases[n] for n in names]:
        r = hc.run_cases([c], os.path.join(folder), mode="cli")[0]
        peaks[c.name] = (r["maxrss_mb"], r["rc"])
    base = peaks["normal"][0]
    worst = max((n for n in names), key=lambda n: peaks[n][0])
    emit(metric="peak_memory", normal_run_mb=round(base, 1),
         cases={n: {"maxrss_mb": round(p, 1), "exit": rc} for n, (p, rc) in peaks.items() if n != "normal"},
         worst=worst, worst_ratio=round(peaks[worst][0] / base, 3))


def bench_prepass() -> None:
    from amct_torch.config.textproto import join_multiline_strings
    old = re.compile(r"""#[^\n]*|"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'""", re.S)
    for kb in (20, 40, 80):
        text = "skip_layers: '" + "\\'" * (kb * 512) + "\n"
        t = time.perf_counter()
        join_multiline_strings(text)
        new_s = time.perf_counter() - t
        t = time.perf_counter()
        old.sub(lambda m: m.group(0), text) if kb <= 40 else None
        old_s = time.perf_counter() - t if kb <= 40 else None
        emit(metric="text_prepass", kb=kb, seconds=round(new_s, 5),
             old_regex_seconds=None if old_s is None else round(old_s, 3))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=30, help="kills per filesystem layout")
    ap.add_argument("--fuzz", type=int, default=300, help="mutations per reader")
    ap.add_argument("--skip", default="", help="comma-separated parts to skip")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="bench_hostile_")
    try:
        skip = set(args.skip.split(","))
        if "prepass" not in skip:
            bench_prepass()
        if "hostile" not in skip:
            bench_hostile(work)
        if "api" not in skip:
            bench_api_arguments(work)
        if "commit" not in skip:
            bench_commit_failures(work)
        if "printing" not in skip:
            bench_printing(work)
        if "fuzz" not in skip:
            bench_fuzz(work, args.fuzz)
        if "memory" not in skip:
            bench_memory(work)
        if "kills" not in skip:
            bench_kills(work, args.kills)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
