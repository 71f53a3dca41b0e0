"""int2 K and V, asymmetric, groups of 32 along head_dim: 3.0 bits/element.

Measured (SmolLM2-135M-Instruct, Q4_1 GGUF weights; WikiText-2 test, first 40
windows x 512, second-half scoring, float32 compute, 2-core CPU; one sweep for
all presets, command in results/formats.md "Results"): dPPL +177 [+164, +190] against
baseline PPL 23.5115, KL 2.046 ± 0.034, top-1 0.2770 ± 0.0074; stored 3.00
bits/element, effective 3.00 at 512 tokens and 3.00 at 4096. Full precision: K:
none; V: none.

Run: python -m experiments.run --config=int2_g32_asym
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.get_config()
  c.cache.k = base.kv(type='int', bits=2, scheme='asymmetric', group_size=32)
  c.cache.v = base.kv(type='int', bits=2, scheme='asymmetric', group_size=32)
  return c
