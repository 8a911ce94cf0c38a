"""The calibration core: observers on the fused model fed by a forward pre-hook session, the
calibration loop (one process or one rank of many), checkpoints and the devices' backends.

Names are imported on first use (module ``__getattr__``): the command line reads the
distributed launch's environment before torch loads.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from amct_torch.runtime.lazy_names import lazy_names

#: name -> the module that defines it
_LAZY = {
    **{n: "amct_torch.calibration.checkpoint" for n in ("Checkpointer", "describe_data", "set_run_fingerprint")},
    **{n: "amct_torch.calibration.distributed" for n in ("init_distributed", "launched_by_torchrun")},
    **{n: "amct_torch.calibration.loop" for n in ("resolve_device", "run_calibration")},
    "CalibrationSession": "amct_torch.calibration.session",
}

__all__ = ["CalibrationSession", "Checkpointer", "describe_data", "init_distributed", "launched_by_torchrun",
           "resolve_device", "run_calibration", "set_run_fingerprint"]

__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())

if TYPE_CHECKING:  # static analysers and IDEs see the real names
    from amct_torch.calibration.checkpoint import Checkpointer, describe_data, set_run_fingerprint
    from amct_torch.calibration.distributed import init_distributed, launched_by_torchrun
    from amct_torch.calibration.loop import resolve_device, run_calibration
    from amct_torch.calibration.session import CalibrationSession
