"""How an SSD net's AP integrates precision over recall (``ap_version``), named once.

Why a module of its own, without torch or numpy: ``amct-torch test --help`` lists the choices
and the options check them before anything heavy is imported; ``detection_map.py`` computes
each. "11point" (VOC2007), "MaxIntegral" (VOC2012, ILSVRC), "Integral" (the SSD fork's default)."""
from __future__ import annotations

__all__ = ["AP_VERSIONS", "DEFAULT_AP_VERSION"]

#: every ap_version the SSD fork's solver takes
AP_VERSIONS = ("11point", "MaxIntegral", "Integral")
#: the fork's default
DEFAULT_AP_VERSION = "Integral"
