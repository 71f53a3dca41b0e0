"""int4 K and V, symmetric, groups of up to 128 along head_dim.

Groups never span heads, so on head_dim <= 128 (SmolLM2: 64) a group is one
whole (token, head) vector, i.e. per_token: 4.25 bits/element at head_dim 64.

Measured (SmolLM2-135M-Instruct, Q4_1 GGUF weights; WikiText-2 test, first 40
windows x 512, second-half scoring, float32 compute, 2-core CPU; one sweep for
all presets, command in results/formats.md "Results"): dPPL +6.34 [+5.84, +6.84]
against baseline PPL 23.5115, KL 0.2091 ± 0.0049, top-1 0.7485 ± 0.0051; stored
4.25 bits/element, effective 4.25 at 512 tokens and 4.25 at 4096. Full
precision: K: none; V: none.

Run: python -m experiments.run --config=int4_g128
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.get_config()
  c.cache.k = base.kv(type='int', bits=4, granularity='per_token', group_size=0)
  c.cache.v = base.kv(type='int', bits=4, granularity='per_token', group_size=0)
  return c
