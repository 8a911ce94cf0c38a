"""The AMCT steps over an in-memory graph: load, BN fusion + ARQ, calibration, finish.

``amct_torch.api`` gives them AMCT's file-based names; the one-call job in
``amct_torch.workflow`` runs them in memory."""
