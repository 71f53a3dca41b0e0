"""int2 K and V, asymmetric, groups of 32 along head_dim: 3.0 bits/element.

Measured (SmolLM2-135M-Instruct, WikiText-2 test, 40 windows x 512, second-half
scoring, float32 compute, 2-core CPU): PPL 201.4202 vs baseline 23.5115
(dPPL +177.9086), KL 2.05189, top-1 0.2823, 3.000 bits/element,
4320 bytes/token over 30 layers (measured from the cache leaves).

Run: python -m experiments.run --config=int2_g32_asym
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.get_config()
  c.cache.k = base.kv(type='int', bits=2, scheme='asymmetric', group_size=32)
  c.cache.v = base.kv(type='int', bits=2, scheme='asymmetric', group_size=32)
  return c
