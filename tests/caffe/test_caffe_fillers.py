"""A layer the caffemodel does not name gets its blobs from its fillers, as Caffe builds the net
before copying the trained layers: ``bilinear`` (checked against the upsampling kernel written
here from its definition, and the whole forward against OpenCV given those weights; OpenCV
itself crashes on a Deconvolution without blobs), ``constant``, Caffe's defaults for biases and
Scale. A random filler or a weight without filler is refused naming the caffemodel."""
from __future__ import annotations

import numpy as np
import pytest

from amct_torch.caffe.fillers import bilinear
from amct_torch.caffe.graph import load_caffe
from amct_torch.caffe.layers.base import layer_modules
from amct_torch.errors import ModelError
from helpers.caffe_nets import assert_close, make_net, rand, run_cv, run_ours


def upsample_kernel(k: int) -> np.ndarray:
    """The k x k bilinear interpolation kernel of an upsampling by factor (k + 1) // 2: weight
    1 - |i - centre| / factor along each axis, the centre at factor - 1 (odd k) or factor - 0.5."""
    factor = (k + 1) // 2
    centre = factor - 1 if k % 2 == 1 else factor - 0.5
    og = np.arange(k, dtype=np.float64)
    ramp = 1 - np.abs(og - centre) / factor
    return np.outer(ramp, ramp).astype(np.float32)


def test_upsample_kernel_reference_by_hand():
    # kernel 4 (factor 2): ramp 0.25 0.75 0.75 0.25
    np.testing.assert_allclose(upsample_kernel(4)[0], [0.0625, 0.1875, 0.1875, 0.0625])
    # kernel 3 (factor 2, centre 1): ramp 0.5 1 0.5, so the middle row is the ramp itself
    np.testing.assert_allclose(upsample_kernel(3)[1], [0.5, 1.0, 0.5])


@pytest.mark.parametrize("k", [1, 4, 5, 8, 9, 16])
def test_bilinear_filler_is_the_upsampling_kernel(k):
    """For the kernels the filler is meant for (2f - f mod 2, used with stride f) Caffe's
    formula and the upsampling kernel agree."""
    got = bilinear((3, 2, k, k))
    for n in range(3):
        for c in range(2):
            np.testing.assert_allclose(got[n, c], upsample_kernel(k), rtol=0, atol=1e-7)


def test_bilinear_filler_on_other_kernels_follows_caffes_formula_by_hand():
    # kernel 3: f = 2, c = 0.75; |x/f - c| = 0.75, 0.25, 0.25 -> ramp 0.25 0.75 0.75
    np.testing.assert_allclose(bilinear((1, 1, 3, 3))[0, 0, 0], [0.0625, 0.1875, 0.1875])
    # kernel 2: f = 1, c = 0 -> ramp 1 0
    np.testing.assert_allclose(bilinear((1, 1, 2, 2))[0, 0], [[1, 0], [0, 0]])


DECONV = ('layer {{ name: "up" type: "Deconvolution" bottom: "data" top: "up" param {{ lr_mult: 0 }} '
          'convolution_param {{ num_output: {c} group: {g} kernel_size: {k} stride: {s} pad: {p} '
          'bias_term: false {filler} }} }}\n')


@pytest.mark.parametrize("c,g,k,s,p", [(3, 3, 4, 2, 1), (2, 2, 5, 3, 1), (4, 4, 8, 4, 2), (2, 1, 4, 2, 1)])
def test_deconvolution_without_blobs_upsamples_like_opencv_with_the_bilinear_weights(tmp_path, c, g, k, s, p):
    filler = 'weight_filler { type: "bilinear" }'
    proto, model = make_net(tmp_path, DECONV.format(c=c, g=g, k=k, s=s, p=p, filler=filler),
                            {"data": (1, c, 5, 7)}, {}, name="noblobs")
    ref_w = np.broadcast_to(upsample_kernel(k), (c, c // g, k, k)).copy()
    ref_proto, ref_model = make_net(tmp_path, DECONV.format(c=c, g=g, k=k, s=s, p=p, filler=""),
                                    {"data": (1, c, 5, 7)}, {"up": [ref_w]}, name="given")
    x = rand(1, c, 5, 7)
    ours = run_ours(proto, model, x)["up"]
    assert_close(ours, run_cv(ref_proto, ref_model, {"data": x}, ["up"])["up"], 1e-5)


def test_constant_fillers_and_default_bias(tmp_path):
    body = ('layer { name: "conv" type: "Convolution" bottom: "data" top: "conv" convolution_param { '
            'num_output: 2 kernel_size: 1 weight_filler { type: "constant" value: 0.5 } '
            'bias_filler { type: "constant" value: 0.25 } } }\n'
            'layer { name: "fc" type: "InnerProduct" bottom: "conv" top: "fc" inner_product_param { '
            'num_output: 2 weight_filler { type: "constant" value: -1 } } }\n')
    proto, model = make_net(tmp_path, body, {"data": (1, 3, 2, 2)}, {})
    mods = layer_modules(load_caffe(proto, model))
    np.testing.assert_array_equal(mods["conv"].weight.numpy(), np.full((2, 3, 1, 1), 0.5, np.float32))
    np.testing.assert_array_equal(mods["conv"].bias.numpy(), [0.25, 0.25])
    np.testing.assert_array_equal(mods["fc"].weight.numpy(), -np.ones((2, 8), np.float32))
    np.testing.assert_array_equal(mods["fc"].bias.numpy(), [0, 0])  # Caffe's default bias filler
    x = rand(1, 3, 2, 2)
    conv = 0.5 * x.sum(axis=1, keepdims=True).repeat(2, axis=1) + 0.25
    np.testing.assert_allclose(run_ours(proto, model, x)["fc"], -conv.reshape(1, -1).sum(1, keepdims=True).repeat(2, 1),
                               rtol=1e-5)


def test_scale_layer_absent_from_the_caffemodel_is_the_identity(tmp_path):
    body = ('layer { name: "s" type: "Scale" bottom: "data" top: "s" scale_param { bias_term: true } }\n')
    proto, model = make_net(tmp_path, body, {"data": (1, 3, 2, 2)}, {})
    x = rand(1, 3, 2, 2)
    np.testing.assert_array_equal(run_ours(proto, model, x)["s"], x)


@pytest.mark.parametrize("kind", ["gaussian", "xavier", "msra", "uniform", "positive_unitball"])
def test_random_filler_is_refused_naming_the_caffemodel(tmp_path, kind):
    filler = f'weight_filler {{ type: "{kind}" }}'
    proto, model = make_net(tmp_path, DECONV.format(c=2, g=2, k=4, s=2, p=1, filler=filler), {"data": (1, 2, 4, 4)}, {})
    with pytest.raises(ModelError) as info:
        load_caffe(proto, model)
    err = info.value
    assert err.file == model and err.layer == "up"
    assert kind in str(err) and "random" in str(err) and "reproducible" in str(err)


def test_weight_without_filler_is_refused(tmp_path):
    proto, model = make_net(tmp_path, DECONV.format(c=2, g=2, k=4, s=2, p=1, filler=""), {"data": (1, 2, 4, 4)}, {})
    with pytest.raises(ModelError) as info:
        load_caffe(proto, model)
    assert info.value.file == model and info.value.layer == "up" and "weight_filler" in str(info.value)


def test_a_layer_present_with_too_few_blobs_is_still_an_error(tmp_path):
    # Caffe copies a named layer's blobs and refuses a different count: no filler applies
    body = ('layer { name: "conv" type: "Convolution" bottom: "data" top: "conv" convolution_param { '
            'num_output: 2 kernel_size: 1 bias_filler { type: "constant" value: 1 } } }\n')
    proto, model = make_net(tmp_path, body, {"data": (1, 3, 2, 2)}, {"conv": [rand(2, 3, 1, 1)]})
    with pytest.raises(ModelError) as info:
        load_caffe(proto, model)
    assert info.value.file == model and info.value.layer == "conv"
