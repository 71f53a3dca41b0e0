"""The cache kinds the speed benchmarks compare by default.

A kind is any name `settings.kinds.resolve_kind` takes: "bf16" or
"float32" (the dense full-precision cache in that storage dtype; the
fastest dense kind is the baseline a quantized cache has to beat), a preset
(`configs/NAME.py` or a path to a preset file: its cache spec and cache
dtype, exactly what `experiments.run --config=NAME` decodes with) or a
short spec (`int2_pc32_asym`).
"""

DEFAULT_KINDS = ("bf16", "float32", "int8", "q4_0", "kivi2", "kvq4")
