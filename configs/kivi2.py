"""KIVI-2: K per-channel over 32-token groups, V per-token in groups of 32, asymmetric int2, 128-token full-precision residual: 3.0 bits/element + the residual.

Run: python -m experiments.run --config=kivi2
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.get_config()
  c.cache.k = base.kv(type='int', bits=2, scheme='asymmetric', granularity='per_channel', group_size=32)
  c.cache.v = base.kv(type='int', bits=2, scheme='asymmetric', group_size=32)
  c.cache.residual = 128
  return c
