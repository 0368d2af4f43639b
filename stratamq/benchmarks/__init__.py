"""Benchmarks of the embedded store (run them through ``bench/store.py``)."""
