"""fp8 e5m2 K and V with one bfloat16 scale per (token, head): 8.25 bits/element.

Run: python -m experiments.run --config=fp8_e5m2
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.get_config()
  c.cache.k = base.kv(type='fp8_e5m2', granularity='per_token', group_size=0)
  c.cache.v = base.kv(type='fp8_e5m2', granularity='per_token', group_size=0)
  return c
