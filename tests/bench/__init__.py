"""Benchmarks: `make bench` runs them all and writes BENCHMARKS.md.

Each module ``tests/bench/bench_<name>.py`` defines ``TITLE`` and
``run(quick: bool) -> str`` returning a Markdown section body. Benchmarks
measure, they never assert timings; each compares against a baseline measured
in the same run (loopback echo, raw fsync rate, ...) because machines are noisy.
"""
