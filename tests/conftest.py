"""Shared test fixtures: the devices present, the real nsfw Caffe model, natural images."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from helpers.data import natural_images_bgr, nsfw_dir

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


@pytest.fixture(scope="session")
def nsfw_model() -> tuple[str, str]:
    """(deploy.prototxt, caffemodel) of the real Caffe ResNet-50-1by2."""
    d = nsfw_dir()
    return os.path.join(d, "deploy.prototxt"), os.path.join(d, "resnet_50_1by2_nsfw.caffemodel")


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
