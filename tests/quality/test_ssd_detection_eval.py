"""The SSD fork's TEST-phase net: DetectionEvaluate's rows on hand-worked boxes, the mAP of
accumulated rows against hand-worked numbers for each ap_version, and ``amct-torch test`` on
an SSD test net over an AnnotatedData LMDB: its float mAP against OpenCV's Caffe importer's
detections, its int8 ONNX mAP against ONNX Runtime's, both scored by a plain VOC-style
evaluation written here."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from amct_torch.caffe.layers.ssd_eval import DetectionEvaluateLayer
from amct_torch.cli import main
from amct_torch.errors import DataError, ModelError
from amct_torch.proto import amct_caffe_pb2 as pb
from amct_torch.quality.detection_map import DetectionMap
from amct_torch.quality.net_scores import caffe_test
from helpers.ssd import ssd_test_net

A = [0.1, 0.1, 0.5, 0.5]          # item 0, label 1
B = [0.6, 0.6, 0.9, 0.9]          # item 0, label 1, difficult
C = [0.2, 0.2, 0.4, 0.6]          # item 0, label 2
D = [0.0, 0.0, 0.3, 0.3]          # item 1, label 1
GT = [[0, 1, 0, *A, 0], [0, 1, 1, *B, 1], [0, 2, 0, *C, 0], [1, 1, 0, *D, 0],
      [-1, -1, -1, -1, -1, -1, -1, -1]]
# in no particular order: the layer ranks an item's detections of a label by score
DET = [[1, 2, 0.5, 0.1, 0.1, 0.2, 0.2],       # item 1 has no label-2 box: false positive
       [0, 1, 0.8, 0.12, 0.1, 0.5, 0.5],      # IoU 0.95 with A, taken by the 0.9 one: duplicate
       [0, 2, 0.6, 0.6, 0.0, 0.9, 0.2],       # IoU 0 with C: false positive
       [0, 1, 0.9, 0.1, 0.1, 0.5, 0.52],      # IoU 0.952 with A: true positive
       [1, 1, 0.4, 0.0, 0.0, 0.3, 0.3],       # D exactly: true positive
       [0, 1, 0.7, 0.6, 0.6, 0.9, 0.9],       # the difficult B exactly
       [2, -1, -1, -1, -1, -1, -1]]           # DetectionOutput's no-detection row: skipped


def _layer(**p) -> DetectionEvaluateLayer:
    lp = pb.LayerParameter(name="detection_eval", type="DetectionEvaluate",
                           bottom=["detection_out", "label"], top=["detection_eval"])
    lp.detection_evaluate_param.num_classes = 3
    for k, v in p.items():
        setattr(lp.detection_evaluate_param, k, v)
    return DetectionEvaluateLayer(lp)


def _run(layer, det=DET, gt=GT, device="cpu") -> list[list[float]]:
    out = layer(torch.tensor(det, dtype=torch.float32, device=device).view(1, 1, -1, 7),
                torch.tensor(gt, dtype=torch.float32, device=device).view(1, 1, -1, 8))
    assert out.shape[:2] == (1, 1) and out.shape[3] == 5 and out.device.type == torch.device(device).type
    return np.round(out.reshape(-1, 5).cpu().numpy().astype(np.float64), 5).tolist()


def test_rows_leave_difficult_out(device):
    """evaluate_difficult_gt false: B is not counted and the detection on it is neither a
    true nor a false positive (tp = fp = 0)."""
    rows = _run(_layer(evaluate_difficult_gt=False), device=device)
    assert rows == [[-1, 1, 2, -1, -1], [-1, 2, 1, -1, -1],
                    [0, 1, 0.9, 1, 0], [0, 1, 0.8, 0, 1], [0, 1, 0.7, 0, 0],
                    [0, 2, 0.6, 0, 1],
                    [1, 1, 0.4, 1, 0], [1, 2, 0.5, 0, 1]]


def test_rows_count_difficult_and_threshold():
    """Default evaluate_difficult_gt: B counts and is hit; overlap_threshold 0.96 turns the
    0.952 hit on A into a false positive (the 0.95 duplicate too)."""
    assert _run(_layer())[:5] == [[-1, 1, 3, -1, -1], [-1, 2, 1, -1, -1],
                                  [0, 1, 0.9, 1, 0], [0, 1, 0.8, 0, 1], [0, 1, 0.7, 1, 0]]
    strict = _run(_layer(overlap_threshold=0.96))
    assert strict[2:4] == [[0, 1, 0.9, 0, 1], [0, 1, 0.8, 0, 1]]
    assert strict[4] == [0, 1, 0.7, 1, 0]


def _map(rows_per_iteration, version):
    m = DetectionMap(version)
    for rows in rows_per_iteration:
        m.add(torch.tensor(rows, dtype=torch.float32).view(1, 1, -1, 5))
    return m


@pytest.mark.parametrize("version, label1", [
    # label 1 ranked 0.9 tp, 0.8 fp, 0.4 tp over 2 boxes: precision 1, 1/2, 2/3 at recall
    # 1/2, 1/2, 1; label 2 (two false positives) has AP 0
    ("Integral", 1 * 0.5 + 2 / 3 * 0.5),
    ("MaxIntegral", 1 * 0.5 + 2 / 3 * 0.5),
    ("11point", (6 * 1 + 5 * 2 / 3) / 11),   # recall 0..0.5: precision 1; 0.6..1: 2/3
])
def test_map_hand_worked(version, label1):
    rows = _run(_layer(evaluate_difficult_gt=False))
    m = _map([rows], version)
    assert m.num_pos == {1: 2, 2: 1}
    assert m.per_class() == {1: pytest.approx(label1, abs=1e-6), 2: 0.0}
    assert m.value() == pytest.approx(label1 / 2, abs=1e-6)
    # the same rows split over two iterations (item 0, then item 1, each with its counts):
    # each label's detections are ranked over both, so the mAP is the same
    split = [[[-1, 1, 1, -1, -1], [-1, 2, 1, -1, -1]] + rows[2:6],
             [[-1, 1, 1, -1, -1], [-1, 2, 0, -1, -1]] + rows[6:]]
    assert _map(split, version).value() == pytest.approx(label1 / 2, abs=1e-6)


def test_map_counts_difficult_when_asked():
    """With B counted (3 boxes) and hit at 0.7: tp 0.9, fp 0.8, tp 0.7, tp 0.4 -> precision
    1, 1/2, 2/3, 3/4 at recall 1/3, 1/3, 2/3, 1."""
    m = _map([_run(_layer())], "Integral")
    assert m.per_class()[1] == pytest.approx((1 + 2 / 3 + 3 / 4) / 3, abs=1e-6)
    m11 = _map([_run(_layer())], "MaxIntegral")
    assert m11.per_class()[1] == pytest.approx((1 + 3 / 4 + 3 / 4) / 3, abs=1e-6)


def test_name_size_file_compares_in_pixels(tmp_path):
    """With name_size_file the boxes are scaled to each image's size and compared in pixels
    (each side + 1): in a 10x10 image the corner-touching boxes (0, 0, 1, 1) and (1, 1, 2, 2)
    overlap in one pixel, IoU 1 / (4 + 4 - 1) = 1/7; in a 1000x1000 one 1 / (2 x 101^2 - 1);
    normalised they do not overlap. The image count moves one per item and wraps."""
    (tmp_path / "test_name_size.txt").write_text("000001 10 10\n000002 1000 1000\n\n000003 1000 1000\n")
    gt = [[0, 1, 0, 0.0, 0.0, 0.1, 0.1, 0], [1, 1, 0, 0.0, 0.0, 0.1, 0.1, 0]]
    det = [[0, 1, 0.9, 0.1, 0.1, 0.2, 0.2], [1, 1, 0.8, 0.1, 0.1, 0.2, 0.2]]
    assert _run(_layer(overlap_threshold=0.1), det, gt)[2:] == [[0, 1, 0.9, 0, 1], [1, 1, 0.8, 0, 1]]
    lp = pb.LayerParameter(name="detection_eval", type="DetectionEvaluate", bottom=["d", "l"], top=["e"])
    p = lp.detection_evaluate_param
    p.num_classes, p.overlap_threshold, p.name_size_file = 3, 0.1, "test_name_size.txt"
    layer = DetectionEvaluateLayer(lp, file=str(tmp_path / "test.prototxt"))
    layer.test_tally()
    assert _run(layer, det, gt)[2:] == [[0, 1, 0.9, 1, 0], [1, 1, 0.8, 0, 1]]    # sizes 1, 2
    assert _run(layer, det, gt)[2:] == [[0, 1, 0.9, 0, 1], [1, 1, 0.8, 1, 0]]    # sizes 3, 1
    layer.test_tally()                                                           # a new form
    assert _run(layer, det, gt)[2:] == [[0, 1, 0.9, 1, 0], [1, 1, 0.8, 0, 1]]
    assert float(np.float32(1) / np.float32(7)) > 0.1 > 1 / (2 * 101 ** 2 - 1)
    (tmp_path / "bad.txt").write_text("000001 10\n")
    p.name_size_file = "bad.txt"
    with pytest.raises(DataError, match="line 1"):
        DetectionEvaluateLayer(lp, file=str(tmp_path / "test.prototxt")).evaluate(
            torch.tensor(det).view(1, 1, -1, 7), torch.tensor(gt).view(1, 1, -1, 8))
    p.name_size_file = "missing.txt"
    with pytest.raises(DataError, match="missing.txt"):
        DetectionEvaluateLayer(lp, file=str(tmp_path / "test.prototxt")).evaluate(
            torch.tensor(det).view(1, 1, -1, 7), torch.tensor(gt).view(1, 1, -1, 8))
    p.resize_param.resize_mode = pb.ResizeParameter.FIT_SMALL_SIZE
    with pytest.raises(ModelError, match="WARP"):
        DetectionEvaluateLayer(lp)


def test_bad_params_and_blobs():
    lp = pb.LayerParameter(name="e", type="DetectionEvaluate", bottom=["d", "l"], top=["e"])
    with pytest.raises(ModelError, match="num_classes"):
        DetectionEvaluateLayer(lp)
    with pytest.raises(DataError, match="rows of 8"):
        _layer()(torch.zeros(1, 1, 1, 7), torch.zeros(1, 1, 1, 7))
    with pytest.raises(DataError, match="background label"):
        _run(_layer(), gt=[[0, 0, 0, *A, 0]])
    with pytest.raises(ValueError, match="ap_version"):
        DetectionMap("VOC")


def _iou(a, b):
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    if w <= 0 or h <= 0:
        return 0.0
    return w * h / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - w * h)


def _voc_map(dets, annos, overlap, labels=(1, 2)):
    """VOC-style mAP ("Integral"): each label's detections over all images best score first,
    each matched to its image's box of that label with the largest IoU; difficult boxes not
    counted, a hit on one ignored; AP = sum of precision x recall step."""
    aps = []
    for c in labels:
        gts = {i: [(b[1:5], b[5]) for b in boxes if b[0] == c] for i, boxes in enumerate(annos)}
        npos = sum(1 for g in gts.values() for _, d in g if not d)
        taken = {i: [False] * len(g) for i, g in gts.items()}
        mine = sorted([d for d in dets if d[1] == c], key=lambda d: -d[2])
        tp = fp = 0
        ap, prev = 0.0, 0.0
        for item, _, _, *box in mine:
            ious = [_iou(box, g) for g, _ in gts[item]]
            j = int(np.argmax(ious)) if ious else -1
            if j >= 0 and ious[j] >= overlap:
                if gts[item][j][1]:
                    continue
                if taken[item][j]:
                    fp += 1
                else:
                    taken[item][j] = True
                    tp += 1
            else:
                fp += 1
            rec = tp / npos
            if rec - prev > 1e-6:
                ap += tp / (tp + fp) * (rec - prev)
            prev = rec
        aps.append(ap)
    return sum(aps) / len(aps)


def _inputs(folder):
    """The LMDB's images as the TEST transform makes them: decoded BGR, (x - mean) x scale."""
    import cv2
    import lmdb

    out = []
    env = lmdb.open(str(folder / "voc_test_lmdb"), readonly=True, lock=False)
    with env.begin() as txn:
        for _, value in txn.cursor():
            a = pb.AnnotatedDatum()
            a.ParseFromString(value)
            im = cv2.imdecode(np.frombuffer(a.datum.data, np.uint8), cv2.IMREAD_COLOR).astype(np.float32)
            x = (im - np.array([104, 117, 123], np.float32)) * np.float32(0.017)
            out.append(x.transpose(2, 0, 1)[None])
    env.close()
    return out


def _rows(item, out):
    return [(item, int(r[1]), float(r[2]), *map(float, r[3:])) for r in out.reshape(-1, 7) if r[1] >= 1]


def _opencv_detections(deploy, weights, folder):
    import cv2

    net = cv2.dnn.readNetFromCaffe(deploy, weights)
    dets = []
    for item, x in enumerate(_inputs(folder)):
        net.setInput(x)
        dets += _rows(item, net.forward())
    return dets


def _ort_detections(onnx_path, folder):
    import onnxruntime as ort

    sess = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    out = sess.get_outputs()[0].name
    dets = []
    for item, x in enumerate(_inputs(folder)):
        dets += _rows(item, sess.run([out], {name: x})[0])
    return dets


def test_ssd_test_net_map_calibrate_and_quantized_forms(tmp_path, capsys):
    """The SSD test net (with a TRAIN-only MultiBoxLoss) through test, calibrate without DATA
    and test --quantized: the float mAP equals OpenCV's detections scored plainly."""
    pytest.importorskip("lmdb")
    proto, weights, deploy, annos = ssd_test_net(tmp_path, images=8, batch=4)
    result = caffe_test(proto, weights, iterations=2, quiet=True)
    got = result.forms[0].outputs["detection_eval"]
    want = _voc_map(_opencv_detections(deploy, weights, tmp_path), annos, overlap=0.3)
    assert want > 0
    assert got == pytest.approx(want, abs=1e-4)
    assert result.labels() == [("detection_eval", "detection_eval (mAP, Integral)")]

    assert main(["inspect", proto]) == 0
    assert "detection_eval (DetectionEvaluate)" in capsys.readouterr().out
    prefix = str(tmp_path / "out" / "ssd")
    assert main(["calibrate", proto, weights, "--output", prefix, "--onnx", "-q"]) == 0
    capsys.readouterr()
    assert main(["test", proto, weights, "--iterations", "2", "--quantized", prefix, "--json", "-q",
                 "--ap-version", "11point", "--no-report"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["outputs"] == [{"name": "detection_eval", "loss_weight": 0.0, "figure": "mAP, 11point"}]
    forms = {f["form"]: f["outputs"]["detection_eval"] for f in out["forms"]}
    assert set(forms) == {"float", "fake_quant", "deploy", "onnx"}
    assert all(0 <= v <= 1 for v in forms.values())
    # the int8 ONNX model's mAP: its detections from ONNX Runtime, run here image by image
    pytest.importorskip("onnxruntime")
    both = caffe_test(proto, weights, iterations=2, quiet=True, quantized=prefix)
    onnx_form = next(f for f in both.forms if f.form == "onnx")
    want_int8 = _voc_map(_ort_detections(onnx_form.files[0], tmp_path), annos, overlap=0.3)
    assert onnx_form.outputs["detection_eval"] == pytest.approx(want_int8, abs=1e-4)
    assert both.forms[0].outputs["detection_eval"] == pytest.approx(want, abs=1e-4)
    with pytest.raises(SystemExit) as bad:
        main(["test", proto, weights, "--iterations", "2", "-q", "--ap-version", "VOC"])
    assert bad.value.code == 2
    with pytest.raises(Exception, match="ap_version must be one of"):
        caffe_test(proto, weights, iterations=1, quiet=True, ap_version="VOC")
