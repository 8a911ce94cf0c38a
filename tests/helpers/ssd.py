"""A small ResNet-style SSD detector built by code (BN+Scale, a residual block, Normalize on a
mid feature, two PriorBox heads, Softmax over the class axis, DetectionOutput) with options for
each PriorBox / DetectionOutput variant, for the ONNX, deploy and calibration tests."""
from __future__ import annotations

import os

import numpy as np

from helpers.caffe_nets import make_net

NUM_CLASSES = 3


def _conv(name, bottom, n, k=3, s=1, p=1, bias=True):
    bt = "" if bias else " bias_term: false"
    return (f'layer {{ name: "{name}" type: "Convolution" bottom: "{bottom}" top: "{name}" '
            f'convolution_param {{ num_output: {n} kernel_size: {k} stride: {s} pad: {p}{bt} }} }}\n')


def _bn_relu(name, top):
    return (f'layer {{ name: "{name}_bn" type: "BatchNorm" bottom: "{top}" top: "{top}" }}\n'
            f'layer {{ name: "{name}_scale" type: "Scale" bottom: "{top}" top: "{top}" scale_param {{ bias_term: true }} }}\n'
            f'layer {{ name: "{name}_relu" type: "ReLU" bottom: "{top}" top: "{top}" }}\n')


def ssd_net(folder, *, share_location=True, background=0, code_type="CENTER_SIZE", encoded=False,
            keep_top_k=20, top_k=30, conf_thr=0.3, nms=0.45, eta=1.0, prior1="", prior2="",
            size=64, seed=0, name="ssd", loc_scale=0.5, head_bias=True) -> tuple[str, str]:
    """Write the net; ``prior1``/``prior2``: extra prior_box_param text of the two heads;
    ``head_bias``: False gives the loc/conf convolutions no bias (as some face detectors)."""
    rng = np.random.default_rng(seed)
    c = NUM_CLASSES
    body, blobs = "", {}

    def conv(nm, bottom, cin, n, k=3, s=1, p=1, bias=True, scale=1.0):
        nonlocal body
        body += _conv(nm, bottom, n, k, s, p, bias)
        w = rng.standard_normal((n, cin, k, k)).astype(np.float32) * scale * np.sqrt(2.0 / (cin * k * k))
        blobs[nm] = [w] + ([rng.standard_normal(n).astype(np.float32) * 0.1] if bias else [])

    def bn(nm, top, ch):
        nonlocal body
        body += _bn_relu(nm, top)
        blobs[f"{nm}_bn"] = [rng.standard_normal(ch).astype(np.float32) * 0.1,
                             (rng.random(ch) + 0.5).astype(np.float32), np.ones(1, np.float32)]
        blobs[f"{nm}_scale"] = [(rng.random(ch) + 0.5).astype(np.float32),
                                rng.standard_normal(ch).astype(np.float32) * 0.1]

    conv("conv1", "data", 3, 8, s=2, bias=False)
    bn("conv1", "conv1", 8)
    conv("conv2", "conv1", 8, 16, s=2, bias=False)
    bn("conv2", "conv2", 16)
    body += 'layer { name: "conv2_norm" type: "Normalize" bottom: "conv2" top: "conv2_norm" norm_param { across_spatial: false channel_shared: false } }\n'
    blobs["conv2_norm"] = [np.full(16, 10.0, np.float32)]
    conv("conv3a", "conv2", 16, 16, s=2)
    body += 'layer { name: "conv3a_relu" type: "ReLU" bottom: "conv3a" top: "conv3a" }\n'
    conv("conv3b", "conv3a", 16, 16)
    conv("conv3s", "conv2", 16, 16, k=1, s=2, p=0)
    body += ('layer { name: "res3" type: "Eltwise" bottom: "conv3b" bottom: "conv3s" top: "res3" }\n'
             'layer { name: "res3_relu" type: "ReLU" bottom: "res3" top: "res3" }\n')
    n_loc = 1 if share_location else c
    heads = [("h1", "conv2_norm", 16, prior1 or "min_size: 12 max_size: 24 aspect_ratio: 2 flip: true clip: false"),
             ("h2", "res3", 16, prior2 or "min_size: 28 max_size: 48 aspect_ratio: 2 aspect_ratio: 3 flip: true clip: true")]
    for h, src, ch, pp in heads:
        n_prior = _num_priors(pp)
        conv(f"{h}_loc", src, ch, n_prior * n_loc * 4, scale=loc_scale, bias=head_bias)
        conv(f"{h}_conf", src, ch, n_prior * c, scale=0.4, bias=head_bias)
        for kind in ("loc", "conf"):
            body += (f'layer {{ name: "{h}_{kind}_perm" type: "Permute" bottom: "{h}_{kind}" top: "{h}_{kind}_perm" permute_param {{ order: 0 order: 2 order: 3 order: 1 }} }}\n'
                     f'layer {{ name: "{h}_{kind}_flat" type: "Flatten" bottom: "{h}_{kind}_perm" top: "{h}_{kind}_flat" flatten_param {{ axis: 1 }} }}\n')
        body += (f'layer {{ name: "{h}_prior" type: "PriorBox" bottom: "{src}" bottom: "data" top: "{h}_prior" '
                 f'prior_box_param {{ {pp} variance: 0.1 variance: 0.1 variance: 0.2 variance: 0.2 }} }}\n')
    body += ('layer { name: "mbox_loc" type: "Concat" bottom: "h1_loc_flat" bottom: "h2_loc_flat" top: "mbox_loc" concat_param { axis: 1 } }\n'
             'layer { name: "mbox_conf" type: "Concat" bottom: "h1_conf_flat" bottom: "h2_conf_flat" top: "mbox_conf" concat_param { axis: 1 } }\n'
             'layer { name: "mbox_priorbox" type: "Concat" bottom: "h1_prior" bottom: "h2_prior" top: "mbox_priorbox" concat_param { axis: 2 } }\n'
             f'layer {{ name: "mbox_conf_reshape" type: "Reshape" bottom: "mbox_conf" top: "mbox_conf_reshape" reshape_param {{ shape {{ dim: 0 dim: -1 dim: {c} }} }} }}\n'
             'layer { name: "mbox_conf_softmax" type: "Softmax" bottom: "mbox_conf_reshape" top: "mbox_conf_softmax" softmax_param { axis: 2 } }\n'
             'layer { name: "mbox_conf_flatten" type: "Flatten" bottom: "mbox_conf_softmax" top: "mbox_conf_flatten" flatten_param { axis: 1 } }\n')
    keep = f" keep_top_k: {keep_top_k}" if keep_top_k is not None else ""
    thr = f" confidence_threshold: {conf_thr}" if conf_thr is not None else ""
    tk = f" top_k: {top_k}" if top_k is not None else ""
    body += (f'layer {{ name: "detection_out" type: "DetectionOutput" bottom: "mbox_loc" bottom: "mbox_conf_flatten" '
             f'bottom: "mbox_priorbox" top: "detection_out" detection_output_param {{ num_classes: {c} '
             f'share_location: {str(share_location).lower()} background_label_id: {background} '
             f'nms_param {{ nms_threshold: {nms}{tk} eta: {eta} }} code_type: {code_type} '
             f'variance_encoded_in_target: {str(encoded).lower()}{keep}{thr} }} }}\n')
    return make_net(folder, body, {"data": [1, 3, size, size]}, blobs, name=name)


def _num_priors(pp: str) -> int:
    mins = pp.count("min_size")
    maxs = pp.count("max_size")
    ars = [float(t.split()[1]) for t in pp.split("aspect_ratio:")[1:] for t in [("x " + t.strip())]]
    n_ar = 1 + len(ars) * (2 if "flip: true" in pp else 1)
    return mins * n_ar + maxs


def ssd_test_net(folder, *, images: int = 8, batch: int = 4, size: int = 64, difficult_gt: bool = False,
                 overlap: float = 0.3, seed: int = 0) -> tuple[str, str, str, list]:
    """The SSD net above as the SSD fork's TEST-phase net: an AnnotatedData layer (TEST) over
    an LMDB of ``images`` encoded PNGs with boxes of labels 1 and 2 (every third box difficult),
    a TRAIN-only AnnotatedData and MultiBoxLoss, and DetectionEvaluate on detection_out and the
    label rows. Returns (test prototxt, caffemodel, deploy prototxt, the annotations as
    [(item, label, xmin, ymin, xmax, ymax, difficult)] per record)."""
    from google.protobuf import text_format

    from amct_torch.proto import amct_caffe_pb2 as pb
    from helpers.caffe_dbs import encoded_datum, sized_images, write_lmdb

    deploy, weights = ssd_net(folder, size=size, conf_thr=0.05, keep_top_k=40, top_k=60, seed=seed, loc_scale=0.05)
    rng = np.random.default_rng(seed + 1)
    recs, annos = [], []
    for i, im in enumerate(sized_images(images, (size, size))):
        a = pb.AnnotatedDatum(type=pb.AnnotatedDatum.BBOX)
        a.datum.CopyFrom(encoded_datum(im, 0, ".png"))
        boxes = []
        for k in range(3):
            g = a.annotation_group.add(group_label=1 + k % 2)
            x0, y0 = (float(v) for v in rng.uniform(0.0, 0.6, 2).astype(np.float32))
            w, h = (float(v) for v in rng.uniform(0.12, 0.35, 2).astype(np.float32))
            b = g.annotation.add(instance_id=0).bbox
            b.xmin, b.ymin, b.xmax, b.ymax, b.difficult = x0, y0, x0 + w, y0 + h, (i + k) % 3 == 0
            boxes.append((1 + k % 2, b.xmin, b.ymin, b.xmax, b.ymax, b.difficult))
        annos.append(boxes)
        recs.append((f"{i:08d}_img.png".encode(), a.SerializeToString()))
    write_lmdb(os.path.join(str(folder), "voc_test_lmdb"), recs)
    net = pb.NetParameter()
    with open(deploy) as f:
        text_format.Merge(f.read(), net)
    layers = [l for l in net.layer if l.type != "Input"]
    head = (
        'layer { name: "data" type: "AnnotatedData" top: "data" top: "label" include { phase: TRAIN } '
        'data_param { source: "voc_train_lmdb" batch_size: 32 backend: LMDB } '
        'annotated_data_param { label_map_file: "labelmap_voc.prototxt" } }\n'
        'layer { name: "data" type: "AnnotatedData" top: "data" top: "label" include { phase: TEST } '
        f'data_param {{ source: "voc_test_lmdb" batch_size: {batch} backend: LMDB }} '
        'transform_param { scale: 0.017 mean_value: 104 mean_value: 117 mean_value: 123 } }\n')
    tail = (
        'layer { name: "mbox_loss" type: "MultiBoxLoss" bottom: "mbox_loc" bottom: "mbox_conf" '
        'bottom: "mbox_priorbox" bottom: "label" top: "mbox_loss" include { phase: TRAIN } '
        'propagate_down: true propagate_down: true propagate_down: false propagate_down: false '
        'loss_param { normalization: VALID } multibox_loss_param { loc_loss_type: SMOOTH_L1 '
        f'conf_loss_type: SOFTMAX num_classes: {NUM_CLASSES} share_location: true match_type: PER_PREDICTION '
        'overlap_threshold: 0.5 neg_pos_ratio: 3.0 code_type: CENTER_SIZE } }\n'
        'layer { name: "detection_eval" type: "DetectionEvaluate" bottom: "detection_out" bottom: "label" '
        'top: "detection_eval" include { phase: TEST } detection_evaluate_param { '
        f'num_classes: {NUM_CLASSES} background_label_id: 0 overlap_threshold: {overlap} '
        f'evaluate_difficult_gt: {str(difficult_gt).lower()} }} }}\n')
    body = text_format.MessageToString(pb.NetParameter(layer=layers))
    proto = os.path.join(str(folder), "ssd_test.prototxt")
    with open(proto, "w") as f:  # written as text: MultiBoxLoss's params are not in the schema
        f.write('name: "ssd_test"\n' + head + body + tail)
    return proto, weights, deploy, annos
