"""``amct-torch test`` benchmark: images/s of ``caffe_test`` (data layer + inference + metric
layers) against the float forward alone on the same batches; prints JSON lines.

The net is the nsfw package's Caffe ResNet-50 (resnet_50_1by2) made a train_val: a TEST Data
layer over a 1,000-image LMDB of encoded JPEGs (256×256, as ``convert_imageset --encoded``
writes them; ``crop_size: 224``, ``mean_value`` 104,117,123), then Accuracy and SoftmaxWithLoss
on its last InnerProduct. ``forward_alone`` is the same graph, freshly loaded, on the same
batches decoded beforehand (host to device copy and the first, cold forward included, as in
``test``); ``test`` is ``caffe_test`` with its data source
decoding on its threads while the forwards run. Goal: test / forward_alone >= 0.9.

Run: python benchmarks/bench_caffe_test.py [--images N] [--batch-size N] [--device cpu|cuda]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from google.protobuf import text_format  # noqa: E402

from amct_torch.proto import amct_caffe_pb2 as pb  # noqa: E402
from helpers.caffe_dbs import encoded_datum, imageset_records, sized_images, write_lmdb  # noqa: E402
from helpers.data import nsfw_dir  # noqa: E402


def emit(**kw: object) -> None:
    print(json.dumps(kw), flush=True)


def train_val(deploy: str, source: str, batch_size: int) -> str:
    """The deploy net with a TEST Data layer in place of its input and Accuracy + SoftmaxWithLoss
    on its last InnerProduct."""
    net = pb.NetParameter()
    with open(deploy) as f:
        text_format.Parse(f.read(), net)
    data_name = net.input[0] if net.input else next(l.top[0] for l in net.layer if l.type == "Input")
    out = pb.NetParameter(name=net.name + "_train_val")
    d = out.layer.add(name="data", type="Data", top=[data_name, "label"])
    d.include.add(phase=pb.TEST)
    d.data_param.source, d.data_param.batch_size, d.data_param.backend = source, batch_size, pb.DataParameter.LMDB
    d.transform_param.crop_size = 224
    d.transform_param.mean_value.extend([104, 117, 123])
    last_ip = None
    for layer in net.layer:
        if layer.type == "Input":
            continue
        out.layer.add().CopyFrom(layer)
        if layer.type == "InnerProduct":
            last_ip = layer.top[0]
    out.layer.add(name="accuracy", type="Accuracy", bottom=[last_ip, "label"], top=["accuracy"])
    out.layer.add(name="loss", type="SoftmaxWithLoss", bottom=[last_ip, "label"], top=["loss"])
    return text_format.MessageToString(out)


def forward_alone(model: str, weights: str, iterations: int, device: str) -> tuple[float, int]:
    """Seconds of the float graph's forwards on the same batches, decoded beforehand."""
    import torch

    from amct_torch.caffe.graph import load_caffe
    from amct_torch.quality.net_scores import PhaseData

    gm = load_caffe(model, weights).to(device).eval()
    names = [n for n, _ in gm.caffe_inputs]
    data = PhaseData(gm.meta["caffe_data_layers"], model)
    it = data.batches()
    batches = [next(it) for _ in range(iterations)]
    data.close()
    with torch.no_grad():  # no warm-up: caffe_test's timing includes its first (cold) forward too
        t0 = time.perf_counter()
        for b in batches:
            out = gm(*[torch.from_numpy(b[n]).to(device) for n in names])
        float(next(iter(out.values())).reshape(-1)[0])  # the last result on the host
        secs = time.perf_counter() - t0
    return secs, iterations * int(batches[0][names[0]].shape[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=1000)
    ap.add_argument("--batch-size", type=int, default=50)
    ap.add_argument("--device", default="auto", help="cpu, cuda (default: cuda when present)")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    from amct_torch.runtime.threads import prefer_passive_waits
    prefer_passive_waits()  # as the test command does, before torch loads
    import torch

    from amct_torch.quality.net_scores import caffe_test
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"

    iterations = args.images // args.batch_size
    with tempfile.TemporaryDirectory() as tmp:
        datums = [encoded_datum(im, i % 2) for i, im in enumerate(sized_images(args.images, (256, 256)))]
        write_lmdb(os.path.join(tmp, "val_lmdb"), imageset_records(datums))
        model = os.path.join(tmp, "train_val.prototxt")
        with open(model, "w") as f:
            f.write(train_val(os.path.join(nsfw_dir(), "deploy.prototxt"), "val_lmdb", args.batch_size))
        weights = os.path.join(nsfw_dir(), "resnet_50_1by2_nsfw.caffemodel")
        emit(bench="caffe_test_setup", net="nsfw resnet_50_1by2 train_val", images=args.images, size="256x256",
             crop=224, batch_size=args.batch_size, iterations=iterations, device=args.device,
             cpus=os.cpu_count(), load_avg_1min=os.getloadavg()[0], gpu=_gpu_name(args.device))
        for rep in range(args.repeats):  # interleaved, in turn first: the machine may be shared
            if rep % 2:
                res = caffe_test(model, weights, iterations=iterations, device=args.device, quiet=True)
                secs, images = forward_alone(model, weights, iterations, args.device)
            else:
                secs, images = forward_alone(model, weights, iterations, args.device)
                res = caffe_test(model, weights, iterations=iterations, device=args.device, quiet=True)
            f = res.forms[0]
            emit(bench="caffe_test", repeat=rep, forward_alone_images_per_s=round(images / secs, 1),
                 test_images_per_s=round(f.images_per_second, 1),
                 ratio_test_to_forward=round(f.images_per_second / (images / secs), 3),
                 accuracy=f.outputs.get("accuracy"), loss=f.outputs.get("loss"))


def _gpu_name(device: str) -> object:
    if not device.startswith("cuda"):
        return None
    import torch
    return torch.cuda.get_device_name(torch.device(device))


if __name__ == "__main__":
    main()
