"""fp8 e4m3 K and V with one bfloat16 scale per (token, head): 8.25 bits/element.

Measured (SmolLM2-135M-Instruct, Q4_1 GGUF weights; WikiText-2 test, first 40
windows x 512, second-half scoring, float32 compute, 2-core CPU; one sweep for
all presets, command in results/formats.md "Results"): dPPL +0.117 [+0.064, +0.171]
against baseline PPL 23.5115, KL 0.00471 ± 0.00017, top-1 0.9528 ± 0.0023;
stored 8.25 bits/element, effective 8.25 at 512 tokens and 8.25 at 4096. Full
precision: K: none; V: none.

Run: python -m experiments.run --config=fp8_e4m3
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.get_config()
  c.cache.k = base.kv(type='fp8_e4m3', granularity='per_token', group_size=0)
  c.cache.v = base.kv(type='fp8_e4m3', granularity='per_token', group_size=0)
  return c
