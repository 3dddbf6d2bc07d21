"""Benchmarks (run as scripts: ``python3 bench/<name>.py``)."""
