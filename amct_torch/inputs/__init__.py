"""Calibration inputs: what a user has (image folders, .npy/.npz arrays, tensors, iterables) or
the net's own data layers, decoded and preprocessed the Caffe way into the batches the model
takes; ``plan_batches`` plans a job's batches and checks them before the first forward.

Names are imported on first use (module ``__getattr__``): the command line reads ``limits``
and the preprocessing options before torch loads.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from amct_torch.runtime.lazy_names import lazy_names

#: name -> the module that defines it
_LAZY = {
    **{n: "amct_torch.inputs.plan" for n in ("BatchPlan", "plan_batches")},
    **{n: "amct_torch.inputs.data" for n in ("Preprocess", "calibration_batches", "count_samples")},
    "PhaseData": "amct_torch.inputs.caffe_data",
    **{n: "amct_torch.inputs.limits" for n in ("MAX_BATCH_NUM", "check_batch_num", "check_checkpoint_path",
                                               "check_regular_file")},
    **{n: "amct_torch.inputs.preprocess_options" for n in ("add_preprocess_options", "preprocess_from")},
}

__all__ = ["MAX_BATCH_NUM", "BatchPlan", "PhaseData", "Preprocess", "add_preprocess_options", "calibration_batches",
           "check_batch_num", "check_checkpoint_path", "check_regular_file", "count_samples", "plan_batches",
           "preprocess_from"]

__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())

if TYPE_CHECKING:  # static analysers and IDEs see the real names
    from amct_torch.inputs.caffe_data import PhaseData
    from amct_torch.inputs.data import Preprocess, calibration_batches, count_samples
    from amct_torch.inputs.limits import MAX_BATCH_NUM, check_batch_num, check_checkpoint_path, check_regular_file
    from amct_torch.inputs.plan import BatchPlan, plan_batches
    from amct_torch.inputs.preprocess_options import add_preprocess_options, preprocess_from
