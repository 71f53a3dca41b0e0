"""Baseline only: the full-precision cache in the compute dtype, no quantized run.

Run: python -m experiments.run --config=baseline
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.get_config()
  c.quantize = False
  c.cache.k = base.kv(type='none')
  c.cache.v = base.kv(type='none')
  return c
