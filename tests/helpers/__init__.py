"""Shared test helpers: nets built by code, reference runners, data."""
