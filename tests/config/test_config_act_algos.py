"""The activation algorithm registry (``config/act_algos.py``) against the quant.cfg proto it
mirrors and the observers it names."""
from __future__ import annotations

import pytest

from amct_torch.calibration.observers import make_observer
from amct_torch.config.act_algos import ACT_ALGORITHMS, act_key, by_proto_field
from amct_torch.config.quant_cfg import proto_float
from amct_torch.config.types import LayerQuantConfig
from amct_torch.errors import CalibrationError
from amct_torch.proto import calibration_config_pb2 as cpb


def test_every_quant_cfg_algorithm_has_an_entry_with_the_proto_defaults():
    members = [f.name for f in cpb.CalibrationConfig.DESCRIPTOR.oneofs_by_name["acts_quant_algo"].fields]
    assert sorted(members) == sorted(a.proto_field for a in ACT_ALGORITHMS.values())
    for member in members:
        algo = by_proto_field(member)
        msg = getattr(cpb.CalibrationConfig(), member)
        for f in algo.fields:
            proto = [msg.DESCRIPTOR.fields_by_name[p].default_value for p in f.proto]
            want = tuple(proto_float(v) for v in proto) if f.kind == "range" else \
                (int(proto[0]) if f.kind == "integer" else proto_float(proto[0]))
            assert f.default == want, (member, f.name)


def test_the_default_layer_config_is_the_default_algorithms():
    c = LayerQuantConfig()
    assert (c.act_algo, c.max_percentile, c.min_percentile, c.search_range, c.search_step, c.num_of_bins) == \
        ("ifmr", 0.999999, 0.999999, (0.7, 1.3), 0.01, None)
    h = LayerQuantConfig(act_algo="hfmg", **ACT_ALGORITHMS["hfmg"].layer_fields({"num_of_bins": 2048}))
    assert (h.max_percentile, h.search_range, h.num_of_bins) == (None, None, 2048)
    assert act_key(h) == ("hfmg", 2048, True) and act_key(c) == ("ifmr", 0.999999, 0.999999, (0.7, 1.3), 0.01, True)


@pytest.mark.parametrize("algo,mode,cls", [("ifmr", "streaming", "IfmrStreamingObserver"),
                                           ("ifmr", "exact", "IfmrExactObserver"),
                                           ("hfmg", "streaming", "HfmgObserver"),
                                           ("hfmg", "exact", "HfmgObserver")])
def test_each_algorithm_gets_its_observer(algo, mode, cls):
    cfg = LayerQuantConfig(act_algo=algo, asymmetric=False,
                           **ACT_ALGORITHMS[algo].layer_fields(ACT_ALGORITHMS[algo].defaults()))
    obs = make_observer("conv1", cfg, mode)
    assert type(obs).__name__ == cls


def test_unknown_algorithm_or_mode_is_refused_naming_the_layer():
    with pytest.raises(CalibrationError, match="unknown IFMR mode 'fast'"):
        make_observer("conv1", LayerQuantConfig(), "fast")
    with pytest.raises(CalibrationError, match="unknown activation algorithm 'kl'"):
        make_observer("conv1", LayerQuantConfig(act_algo="kl"))
