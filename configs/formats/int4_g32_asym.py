"""int4 K and V, asymmetric (scale + zero), groups of 32 along head_dim: 5.0 bits/element.

q4_1's layout with bfloat16 scale and zero (configs/formats/q4_1.py is the bit-exact
q4_1).

Measured (SmolLM2-135M-Instruct, Q4_1 GGUF weights; WikiText-2 test, first 40
windows x 512, second-half scoring, float32 compute, 2-core CPU; one sweep for
all presets, command in results/formats.md "Results"): dPPL +1.16 [+0.96, +1.37]
against baseline PPL 23.5115, KL 0.0486 ± 0.0016, top-1 0.8748 ± 0.0033; stored
5.00 bits/element, effective 5.00 at 512 tokens and 5.00 at 4096. Full
precision: K: none; V: none.

Run: python -m experiments.run --config=int4_g32_asym
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.get_config()
  c.cache.k = base.kv(type='int', bits=4, scheme='asymmetric', group_size=32)
  c.cache.v = base.kv(type='int', bits=4, scheme='asymmetric', group_size=32)
  return c
