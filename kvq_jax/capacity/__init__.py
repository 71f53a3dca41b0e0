"""Bytes, effective bits and the context that fits a memory budget.

* `memory`: the byte model of every cache kind (codes, scales, zeros,
  full-precision windows, sinks, per-layer constants), effective bits at a
  context, the maximum context in a budget, the memory report of a run.
"""
