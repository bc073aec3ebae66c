"""Benchmarks and calibration tooling (not part of the installed package; run from the repo root)."""
