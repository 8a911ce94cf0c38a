"""Image decoding is part of the install: in a fresh virtual environment, the package
installed by pip with its own requirements (no test extra) calibrates on an image folder.

The fresh environment sees nothing of this one's packages (no --system-site-packages, which
would hide a missing requirement such as OpenCV) except torch and torch's own requirements,
which are linked in (a ``.pth`` file naming a folder of links to their installed files) to
save installing a 1 GB wheel again: the package asks for ``torch>=2.1``, so pip keeps that
torch and resolves every other requirement itself, from the machine's pip cache/indexes.
"""
from __future__ import annotations

import importlib.metadata as md
import os
import shutil
import subprocess
import sys
import sysconfig

import cv2
import numpy as np
import pytest
from packaging.requirements import Requirement

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def dist_closure(name: str) -> list[md.Distribution]:
    """``name``'s distribution and those it requires (no extras), recursively."""
    seen: dict[str, md.Distribution] = {}
    todo = [name]
    while todo:
        dist = md.distribution(todo.pop())
        key = dist.metadata["Name"].lower().replace("_", "-")
        if key in seen:
            continue
        seen[key] = dist
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return list(seen.values())


def link_torch(site: str, links: str) -> None:
    """Links in ``links`` to torch's installed files and those of its requirements, and a
    ``.pth`` file in the fresh environment's ``site`` naming the folder."""
    os.makedirs(links)
    here = sysconfig.get_paths()["purelib"]
    for dist in dist_closure("torch"):
        tops = {str(f).split("/")[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops:
            src = os.path.join(here, top)
            if os.path.exists(src) and not os.path.exists(os.path.join(links, top)):
                os.symlink(src, os.path.join(links, top))
    with open(os.path.join(site, "torch_linked.pth"), "w") as f:
        f.write(links + "\n")


@pytest.mark.slow
def test_plain_install_calibrates_on_an_image_folder(tmp_path):
    src = tmp_path / "src"  # a copy: pip builds in the source tree
    src.mkdir()
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(os.path.join(REPO, name), src / name)
    shutil.copytree(os.path.join(REPO, "amct_torch"), src / "amct_torch",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    link_torch(site, str(tmp_path / "torch_links"))
    # pip itself, from this environment (a fresh venv's ensurepip is slower)
    pip = subprocess.run([sys.executable, "-m", "pip", "--python", py, "install", "-q",
                          "--disable-pip-version-check", str(src)],
                         capture_output=True, text=True, timeout=900)
    assert pip.returncode == 0, pip.stderr[-3000:]
    where = subprocess.run([py, "-c", "import cv2, lmdb; print(cv2.__file__)"],
                           capture_output=True, text=True)
    assert where.returncode == 0 and where.stdout.startswith(site), where.stdout + where.stderr
    missing = subprocess.run([py, "-c", "import pytest"], capture_output=True, text=True)
    assert missing.returncode != 0, "the test extra leaked into the fresh environment"

    from sklearn.datasets import load_digits
    images = tmp_path / "images"
    images.mkdir()
    digits = load_digits()
    for i in range(4):
        cv2.imwrite(str(images / f"d{i}.png"),
                    cv2.resize((digits.images[i] * 16).astype(np.uint8), (16, 16),
                               interpolation=cv2.INTER_NEAREST))
    model = os.path.join(REPO, "amct_torch", "data", "example")
    out = tmp_path / "out" / "lenet"
    run = subprocess.run([str(venv / "bin" / "amct-torch"), "calibrate",
                          os.path.join(model, "lenet_digits.prototxt"),
                          os.path.join(model, "lenet_digits.caffemodel"), str(images),
                          "--batch-size", "4", "--batch-num", "1", "--output", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    record = (tmp_path / "out" / "lenet_record.txt").read_text()
    assert "scale_d" in record and "conv1" in record
