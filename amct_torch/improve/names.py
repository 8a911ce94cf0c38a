"""The improvements beyond AMCT's result, by name, and how ``improve=`` / ``--improve`` picks them.

Why a module of its own, without torch: ``--help`` and the options' checks read these names
before anything heavy is imported; the pipeline applies them in this order."""
from __future__ import annotations

#: opt-in improvements beyond AMCT's result (``quantize(improve=...)``), in their order of
#: application: cross-layer equalization changes the weights (AMCT's calibration then runs again
#: on them); then, layer by layer in one sequential pass, the output-error activation range, the
#: learned weight rounding (on the input so quantized) and the bias correction (of the output
#: with both) refine the calibrated model (docs/algorithms.md)
IMPROVEMENTS = ("cle", "output_ranges", "adaround", "bias_correction")


def improvement_list(value: object) -> tuple[str, ...]:
    """``improve`` as the tuple of improvements to apply, in ``IMPROVEMENTS`` order: None or ""
    is none; a name, a comma-separated string or a list of names; "all" is every one. An
    unknown name is a ValueError naming it and the choices."""
    if value is None:
        return ()
    if isinstance(value, str):
        names = [v.strip() for v in value.split(",") if v.strip()]
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        names = [v.strip() for v in value]
    else:
        raise ValueError(f"improve must be a name, a comma-separated string or a list of names, got {value!r}")
    if "all" in names:
        return IMPROVEMENTS
    bad = [n for n in names if n not in IMPROVEMENTS]
    if bad:
        raise ValueError(f"unknown improvement {bad[0]!r}: choose from {', '.join(IMPROVEMENTS)} or all")
    return tuple(n for n in IMPROVEMENTS if n in names)
