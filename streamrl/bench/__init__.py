"""Benchmarks and measurements, run by hand or by `streamrl bench`: they sit on top of the shared core and drive the
learner's and the actors' own code (tests/unit/core/test_boundaries.py), so what they measure is what a run does."""
