"""int8 K and V, symmetric, one bfloat16 scale per (token, head): 8.25 bits/element at head_dim 64.

Measured (SmolLM2-135M-Instruct, Q4_1 GGUF weights; WikiText-2 test, first 40
windows x 512, second-half scoring, float32 compute, 2-core CPU; one sweep for
all presets, command in results/formats.md "Results"): dPPL +0.006 [−0.014, +0.026]
against baseline PPL 23.5115 (no measurable change), KL 0.000683 ± 0.000022,
top-1 0.9850 ± 0.0012; stored 8.25 bits/element, effective 8.25 at 512 tokens
and 8.25 at 4096. Full precision: K: none; V: none.

Run: python -m experiments.run --config=int8
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.get_config()
  c.cache.k = base.kv(type='int', bits=8, granularity='per_token', group_size=0)
  c.cache.v = base.kv(type='int', bits=8, granularity='per_token', group_size=0)
  return c
