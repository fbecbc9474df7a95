"""Concluded experiments: one question each about the kernels, answered on a GPU and recorded.

Each module is run as ``python -m experiments.NAME`` (from the project's root, like the
bench commands), checks its variants against float64 before timing them, and writes its
record to ``data/bench/`` through ``bench.common.record``; its CUDA source sits beside it
(``NAME.cu``, ``NAME.cuh``). ``README.md`` says what each one asked and what it found.
"""
