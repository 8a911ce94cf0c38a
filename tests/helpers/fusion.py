"""Test helpers for BN fusion: prototxt snippets and random but plausible blobs for
BatchNorm/Scale, plus running a graph and comparing outputs relatively."""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from helpers.caffe_nets import rand


def bn_text(name: str, bottom: str, top: str, extra: str = "") -> str:
    return (f'layer {{ name: "{name}" type: "BatchNorm" bottom: "{bottom}" top: "{top}" '
            f'batch_norm_param {{ {extra} }} }}\n')


def scale_text(name: str, bottom: str, top: str, bias: bool = True, extra: str = "") -> str:
    return (f'layer {{ name: "{name}" type: "Scale" bottom: "{bottom}" top: "{top}" '
            f'scale_param {{ bias_term: {str(bias).lower()} {extra} }} }}\n')


def bn_blobs(c: int, seed: int, factor: float = 1.0, var: Optional[np.ndarray] = None) -> list[np.ndarray]:
    """Caffe's three BatchNorm blobs: mean·factor, var·factor, [factor] (Caffe divides by it)."""
    rng = np.random.default_rng(seed)
    mean = rng.standard_normal(c).astype(np.float32)
    v = rng.uniform(0.3, 2.0, c).astype(np.float32) if var is None else np.asarray(var, np.float32)
    return [mean * factor, v * factor, np.array([factor], np.float32)]


def scale_blobs(c: int, seed: int, bias: bool = True) -> list[np.ndarray]:
    rng = np.random.default_rng(seed + 1000)
    gamma = rng.uniform(0.5, 1.5, c).astype(np.float32) * rng.choice([-1.0, 1.0], c).astype(np.float32)
    return [gamma] + ([rng.standard_normal(c).astype(np.float32)] if bias else [])


def forward(gm, *xs: np.ndarray, device: str = "cpu") -> dict[str, np.ndarray]:
    with torch.no_grad():
        out = gm.to(device)(*[torch.from_numpy(np.ascontiguousarray(x)).to(device) for x in xs])
    return {k: v.cpu().numpy() for k, v in out.items()}


def assert_rel(ours: np.ndarray, ref: np.ndarray, rel: float = 1e-5) -> None:
    """max |ours − ref| ≤ rel · max |ref| (relative to the output's own magnitude)."""
    ours = np.asarray(ours, np.float64)
    ref = np.asarray(ref, np.float64).reshape(ours.shape)
    err = float(np.abs(ours - ref).max())
    scale = float(np.abs(ref).max())
    assert scale > 0
    assert err <= rel * scale, f"max abs diff {err} vs {rel} x {scale}"


__all__ = ["bn_text", "scale_text", "bn_blobs", "scale_blobs", "forward", "assert_rel", "rand"]
