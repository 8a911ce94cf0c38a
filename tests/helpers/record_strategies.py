"""Hypothesis strategy of any record the file format can represent (float32 scales, int32
offsets, uint32 shift bits and sizes, optional fields absent)."""
from __future__ import annotations

from hypothesis import strategies as st

from amct_torch.record import LayerRecord

f32 = st.floats(width=32, allow_nan=False)
u32 = st.integers(0, 2 ** 32 - 1)
i32 = st.integers(-2 ** 31, 2 ** 31 - 1)

records_st = st.dictionaries(
    st.text(min_size=1, max_size=12),
    st.builds(LayerRecord, scale_d=st.none() | f32, offset_d=st.none() | i32,
              scale_w=st.lists(f32, max_size=5), offset_w=st.lists(i32, max_size=5),
              shift_bit=st.lists(u32, max_size=3), channels=st.none() | u32,
              height=st.none() | u32, width=st.none() | u32, skip_fusion=st.booleans()),
    max_size=6)
