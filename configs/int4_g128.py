"""int4 K and V, symmetric, groups of up to 128 along head_dim.

Groups never span heads, so on head_dim <= 128 (SmolLM2: 64) a group is one
whole (token, head) vector, i.e. per_token: 4.25 bits/element at head_dim 64.

Run: python -m experiments.run --config=int4_g128
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.get_config()
  c.cache.k = base.kv(type='int', bits=4, granularity='per_token', group_size=0)
  c.cache.v = base.kv(type='int', bits=4, granularity='per_token', group_size=0)
  return c
