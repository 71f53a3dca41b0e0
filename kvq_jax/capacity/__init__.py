"""Bytes, effective bits and the context that fits a memory budget.

* `memory`: the byte model of every cache kind (codes, scales, zeros,
  full-precision windows, sinks, per-layer constants), effective bits at a
  context, the maximum context in a budget, the memory report of a run.
* `kinds`: a cache kind priced on a model (stand-in key statistics, the
  serving dtype, the fit check), for `settings.kinds.resolve_kind`.
* `architectures`: named architectures by their published config numbers.
"""
