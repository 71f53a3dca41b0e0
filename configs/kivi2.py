"""KIVI-2: K per-channel over 32-token groups, V per-token in groups of 32, asymmetric int2, 128-token full-precision residual: 3.0 bits/element + the residual.

Measured (SmolLM2-135M-Instruct, WikiText-2 test, 40 windows x 512, second-half
scoring, float32 compute, 2-core CPU): PPL 28.5243 vs baseline 23.5115
(dPPL +5.0128), KL 0.19570, top-1 0.7610, 3.000 bits/element,
4320 bytes/token over 30 layers (measured from the cache leaves).

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
