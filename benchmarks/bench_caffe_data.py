"""Caffe data benchmark: decode rate of a Data layer over a 1,000-image LMDB of encoded JPEGs
(256×256, ``crop_size: 224``, ``mean_value``, as ``convert_imageset --encoded`` writes it)
through amct_torch's DataSource, against OpenCV's ``cv2.imdecode`` alone on the same bytes,
both with the same number of threads; prints JSON lines.

The source does more than OpenCV alone: it reads the records, parses each Datum, crops,
subtracts the mean and writes float32 NCHW batches. The ratio source/opencv says what that
costs. Runs interleave (repeats, medians) because the machine may be shared.

Run: python benchmarks/bench_caffe_data.py [--threads N ...] [--repeats N] [--images N]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from amct_torch.inputs.caffe_data import open_data_layer  # noqa: E402
from helpers.caffe_dbs import (  # noqa: E402  (test helpers: the LMDB as Caffe's tools write it)
    data_layer,
    encoded_datum,
    imageset_records,
    sized_images,
    write_lmdb,
)


def emit(**kw: object) -> None:
    print(json.dumps(kw), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, os.cpu_count() or 1])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--images", type=int, default=1000)
    ap.add_argument("--batch-size", type=int, default=50)
    args = ap.parse_args()
    import cv2

    with tempfile.TemporaryDirectory() as tmp:
        datums = [encoded_datum(im, i % 1000) for i, im in enumerate(sized_images(args.images, (256, 256)))]
        blobs = [d.data for d in datums]
        write_lmdb(os.path.join(tmp, "db"), imageset_records(datums))
        layer = data_layer("db", args.batch_size, crop_size=224, mean_value=[104, 117, 123])
        n_batches = args.images // args.batch_size
        emit(bench="caffe_data_setup", images=args.images, jpeg_bytes_mean=int(np.mean([len(b) for b in blobs])),
             size="256x256", crop=224, batch_size=args.batch_size, cpus=os.cpu_count(),
             load_avg_1min=os.getloadavg()[0])
        for threads in args.threads:
            def opencv_alone(threads: int = threads) -> None:
                with ThreadPoolExecutor(threads) as pool:
                    list(pool.map(lambda b: cv2.imdecode(np.frombuffer(b, np.uint8), cv2.IMREAD_UNCHANGED), blobs))

            def source(threads: int = threads) -> None:
                with open_data_layer(layer, base_dir=tmp, threads=threads) as src:
                    it = src.batches()
                    for _ in range(n_batches):
                        next(it)
                    it.close()

            times: dict[str, list[float]] = {"opencv": [], "source": []}
            opencv_alone(), source()  # warm-up
            for r in range(args.repeats):
                for name in (["opencv", "source"] if r % 2 == 0 else ["source", "opencv"]):
                    t0 = time.perf_counter()
                    (opencv_alone if name == "opencv" else source)()
                    times[name].append(time.perf_counter() - t0)
            cv_rate = args.images / statistics.median(times["opencv"])
            src_rate = n_batches * args.batch_size / statistics.median(times["source"])
            emit(bench="caffe_data_decode", threads=threads, opencv_decode_images_per_s=round(cv_rate, 1),
                 source_images_per_s=round(src_rate, 1), source_over_opencv=round(src_rate / cv_rate, 3),
                 repeats=args.repeats)


if __name__ == "__main__":
    main()
