"""int2 K and V, asymmetric, groups of 32 along head_dim: 3.0 bits/element.

Run: python -m experiments.run --config=int2_g32_asym
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.get_config()
  c.cache.k = base.kv(type='int', bits=2, scheme='asymmetric', group_size=32)
  c.cache.v = base.kv(type='int', bits=2, scheme='asymmetric', group_size=32)
  return c
