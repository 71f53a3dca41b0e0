"""Everything that times or profiles, and what it prints.

* `kinds`: the kinds a benchmark compares by default (names resolved by
  `settings.kinds.resolve_kind`: bf16, float32, a preset or a short spec).
* `decode_bench`, `attention_bench`, `generate_bench`: whole decode steps,
  one layer's attend, whole generate calls (`experiments.bench_decode`,
  `experiments.bench_attention`).
* `decode_speed`: equal slots across kinds, decode tokens/s of a run.
* `read_profile`, `op_profile`: the storage loop per format and the
  per-operation profile (`experiments.profile_read`, `profile_ops`).
* `timing`, `process_memory`: wall-clock timing, the machine line, peak RSS.
* `speed_note`: the line that sets a measured speed-up beside the model's.
"""
