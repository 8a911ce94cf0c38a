"""The small Caffe net the improvement tests quantize: 3x3 Convolutions with ReLU, then an
InnerProduct of 4 outputs; weights and biases drawn with fixed seeds."""
from __future__ import annotations

from helpers.caffe_nets import make_net, rand

#: per Convolution: name, output channels, seeds of its weights and bias, their scales
CONVS = (("conv1", 6, 1, 2, 0.4, 0.2), ("conv2", 5, 3, 4, 0.3, 0.2))


def conv_fc_net(folder, convs: int, size: int) -> tuple[str, str]:
    """The first ``convs`` of ``CONVS`` (no padding), each followed by an in-place ReLU, then
    the InnerProduct ``fc``, on a 3 x ``size`` x ``size`` input: (prototxt, caffemodel) in
    ``folder``."""
    body, blobs, bottom, c_in = "", {}, "data", 3
    for name, c_out, seed_w, seed_b, scale_w, scale_b in CONVS[:convs]:
        body += (f'layer {{ name: "{name}" type: "Convolution" bottom: "{bottom}" top: "{name}"\n'
                 f'        convolution_param {{ num_output: {c_out} kernel_size: 3 }} }}\n'
                 f'layer {{ name: "relu{name[-1]}" type: "ReLU" bottom: "{name}" top: "{name}" }}\n')
        blobs[name] = [rand(c_out, c_in, 3, 3, seed=seed_w, scale=scale_w), rand(c_out, seed=seed_b, scale=scale_b)]
        bottom, c_in = name, c_out
    side = size - 2 * convs
    body += (f'layer {{ name: "fc" type: "InnerProduct" bottom: "{bottom}" top: "fc" '
             'inner_product_param { num_output: 4 } }\n')
    blobs["fc"] = [rand(4, c_in * side * side, seed=5, scale=0.1), rand(4, seed=6, scale=0.1)]
    return make_net(folder, body, {"data": [1, 3, size, size]}, blobs)
