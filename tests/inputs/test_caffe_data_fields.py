"""Data-layer fields that change the numbers are honoured or refused, never dropped: an old
net's ``force_encoded_color``, the SSD fork's ``crop_h``/``crop_w``, and Caffe's random
choices (shuffle, rand_skip, batch_sampler crops), which are warned of."""
from __future__ import annotations

import logging

import cv2
import numpy as np
import pytest

from amct_torch.errors import DataError
from amct_torch.inputs.caffe_data import open_data_layer
from amct_torch.proto import amct_caffe_pb2 as pb
from helpers.caffe_dbs import data_layer, encoded_datum, sized_images, write_lmdb


@pytest.fixture
def grey_lmdb(tmp_path):
    """An LMDB of two grey JPEGs (one channel as stored)."""
    imgs = [np.ascontiguousarray(im[:, :, :1]) for im in sized_images(2, (20, 24))]
    write_lmdb(str(tmp_path / "db"), [(f"{i}".encode(), encoded_datum(im, i).SerializeToString())
                                      for i, im in enumerate(imgs)])
    return str(tmp_path)


def test_old_force_encoded_color_decodes_in_colour(grey_lmdb):
    layer = data_layer("db", 2)
    layer.data_param.force_encoded_color = True
    with open_data_layer(layer, base_dir=grey_lmdb) as src:
        assert src.top_shapes()[0] == (2, 3, 20, 24)
        batch = next(src.batches())
    grey = np.ascontiguousarray(sized_images(2, (20, 24))[1][:, :, :1])
    jpeg = np.frombuffer(encoded_datum(grey, 1).data, np.uint8)
    want = cv2.imdecode(jpeg, cv2.IMREAD_COLOR).transpose(2, 0, 1).astype(np.float32)
    assert np.array_equal(batch["data"][1], want)


def test_one_of_crop_h_and_crop_w_is_refused(grey_lmdb):
    with pytest.raises(DataError, match="crop_h and crop_w"):
        open_data_layer(data_layer("db", 2, crop_h=16), base_dir=grey_lmdb)


def test_random_choices_are_warned_of(grey_lmdb, caplog):
    layer = data_layer("db", 2)
    layer.data_param.rand_skip = 5
    with caplog.at_level(logging.WARNING, logger="amct_torch"):
        open_data_layer(layer, base_dir=grey_lmdb).close()
    assert "data_param rand_skip is random" in caplog.text


def test_a_cropping_batch_sampler_is_warned_of(tmp_path, caplog):
    anno = pb.AnnotatedDatum()
    anno.datum.CopyFrom(encoded_datum(sized_images(1, (20, 24))[0], 0))
    write_lmdb(str(tmp_path / "anno"), [(b"0", anno.SerializeToString())])
    layer = data_layer("anno", 1, kind="AnnotatedData", tops=("data",))
    layer.annotated_data_param.batch_sampler.add()  # the whole image, as SSD test nets: not random
    with caplog.at_level(logging.WARNING, logger="amct_torch"):
        open_data_layer(layer, base_dir=str(tmp_path)).close()
    assert "batch_sampler" not in caplog.text
    layer.annotated_data_param.batch_sampler.add().sampler.min_scale = 0.3
    with caplog.at_level(logging.WARNING, logger="amct_torch"):
        open_data_layer(layer, base_dir=str(tmp_path)).close()
    assert "annotated_data_param batch_sampler (a random crop) is random" in caplog.text


def test_an_hdf5_transform_param_is_refused(tmp_path):
    (tmp_path / "files.txt").write_text("a.h5\n")
    layer = pb.LayerParameter(name="h5", type="HDF5Data", top=["data"])
    layer.hdf5_data_param.source = "files.txt"
    layer.hdf5_data_param.batch_size = 1
    layer.transform_param.scale = 0.5
    with pytest.raises(DataError, match="does not transform its data"):
        open_data_layer(layer, base_dir=str(tmp_path))


def test_a_run_warns_once_of_each_random_choice(grey_lmdb, caplog):
    """Building the net opens its data layers for their shapes, the run opens them again for
    their batches: the warning comes once, and names the mirror with the other choices."""
    from google.protobuf import text_format

    from amct_torch.caffe.graph import load_caffe
    from amct_torch.inputs.caffe_data.phase_data import PhaseData

    net = pb.NetParameter(name="n")
    layer = net.layer.add()
    layer.CopyFrom(data_layer("db", 2))
    layer.data_param.rand_skip = 5
    layer.transform_param.mirror = True
    conv = net.layer.add(name="conv", type="Convolution", bottom=["data"], top=["conv"])
    conv.convolution_param.num_output = 2
    conv.convolution_param.kernel_size.append(3)
    path = f"{grey_lmdb}/net.prototxt"
    with open(path, "w") as f:
        f.write(text_format.MessageToString(net))
    with caplog.at_level(logging.WARNING, logger="amct_torch"):
        gm = load_caffe(path)
        PhaseData(gm.meta["caffe_data_layers"], path).close()
    assert caplog.text.count("random in Caffe") == 1
    assert "data_param rand_skip, transform_param mirror are random in Caffe" in caplog.text
