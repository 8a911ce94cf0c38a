"""save_caffe writes a loaded graph back; OpenCV runs the written model exactly like the
original (and our loader reads it back to the same net)."""
from __future__ import annotations

import numpy as np

from amct_torch.caffe import netio
from helpers.caffe_nets import run_cv
from helpers.data import natural_images_bgr


def test_save_caffe_nsfw_matches_original_in_opencv(tmp_path, nsfw_model):
    from amct_torch.caffe.graph import load_caffe
    proto, weights = nsfw_model
    gm = load_caffe(proto, weights)
    out_proto, out_weights = str(tmp_path / "g.prototxt"), str(tmp_path / "g.caffemodel")
    netio.save_caffe(gm, out_proto, out_weights)
    x = natural_images_bgr(count=2)
    # BatchNorm blobs may come back normalised (scale factor 1), which changes float rounding
    # in OpenCV by a few ulps; every other blob must be bit-identical (checked below).
    np.testing.assert_allclose(run_cv(out_proto, out_weights, {"data": x}, ["prob"])["prob"],
                               run_cv(proto, weights, {"data": x}, ["prob"])["prob"], rtol=1e-5, atol=1e-7)
    original, written = netio.read_net(proto, weights), netio.read_net(out_proto, out_weights)
    assert written.net == original.net
    assert written.blobs.keys() == original.blobs.keys()
    types = {l.name: l.type for l in original.layers}
    for name, arrays in original.blobs.items():
        got = written.blobs[name]
        assert len(got) == len(arrays)
        if types[name] == "BatchNorm":  # compare what Caffe computes: mean = b0/s, var = b1/s
            s0, s1 = arrays[2].item() or 1.0, got[2].item() or 1.0
            np.testing.assert_allclose(got[0] / s1, arrays[0] / s0, rtol=1e-6)
            np.testing.assert_allclose(got[1] / s1, arrays[1] / s0, rtol=1e-6)
            continue
        for a, b in zip(arrays, got):
            np.testing.assert_array_equal(a, b)
