"""The MatMulInteger weight: the InnerProduct's int8 weight transposed, copied in bands."""
from __future__ import annotations

import numpy as np
import pytest

from amct_torch.export.onnx.integer import _transposed


@pytest.mark.parametrize("shape", [(1, 1), (5, 3), (64, 200), (130, 7), (200, 1000)])
@pytest.mark.parametrize("dtype", [np.int8, np.float32])
def test_banded_transpose_is_the_transpose(shape, dtype):
    w = np.random.default_rng(sum(shape)).integers(-128, 128, size=shape).astype(dtype)
    t = _transposed(w)
    assert t.shape == shape[::-1] and t.dtype == w.dtype and t.flags.c_contiguous
    assert np.array_equal(t, w.T)
    assert not np.shares_memory(t, w)
