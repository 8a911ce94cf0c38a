"""Improvements beyond AMCT's own algorithms (opt-in with ``--improve``): each changes the
quantized model's weights or factors to bring its outputs closer to the float model's."""
