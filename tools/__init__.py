"""Tools beside the library: benchmarks, profiling, A/B timing and soak tests.

Run from the repository root (`python -m tools.bench`, `python tools/profile_step.py`).
They import `bert_jax` and `configs`; the `bert_jax` package never imports them.
"""
