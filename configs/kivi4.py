"""KIVI-4: K per-channel over 32-token groups, V per-token in groups of 32, asymmetric int4, 128-token full-precision residual: 5.0 bits/element + the residual.

Run: python -m experiments.run --config=kivi4
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.get_config()
  c.cache.k = base.kv(type='int', bits=4, scheme='asymmetric', granularity='per_channel', group_size=32)
  c.cache.v = base.kv(type='int', bits=4, scheme='asymmetric', group_size=32)
  c.cache.residual = 128
  return c
