"""Quality tools: how close a quantized model is to the float one (the per-layer report,
``evaluate``) and AMCT's accuracy-based auto calibration that acts on it."""
