"""Research tools: per-layer sensitivity sweeps and mixed-precision allocation.

* `selective_cache`: `SelectiveLayerCache`, a full-precision cache whose
  per-layer format choice is *data*, so one compiled forward serves a sweep
  (its round trips are `cache.round_trip`'s).
* `sensitivity`: the sweep plan, its evaluation and the result table.
* `heatmap`: the sensitivity heatmap (matplotlib, Agg).
* `allocator`: per-layer K/V formats under a bits/element budget.
* `preset_writer`: the allocation as a Python preset for experiments.run.
"""
