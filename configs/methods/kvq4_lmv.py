"""kvq4_lmv: keys as kvq4 (int4 asymmetric per channel over 32-token groups,
before RoPE; up to 31 newest keys wait in bfloat16), values int4 Lloyd-Max
codes + one bfloat16 scale per head vector after a randomised Hadamard
rotation. Stored 4.625 bits/element (K 5.0, V 4.25).

Measured (SmolLM2-135M-Instruct, WikiText-2 test, first 40 windows x 512,
second-half scoring, float32, 2-core CPU; the issue-14 sweep in WORKSPACE.md
"Rotations, Lloyd-Max codebooks and calibrated keys"): dPPL +0.271
[+0.183, +0.359] against baseline PPL 23.5115, KL 0.0119 ± 0.0005, top-1
0.9337 ± 0.0023; effective 4.961 bits at 512 tokens (the 31-key window and
the V codebook charged), 4.667 at 4096.

Run: python -m experiments.run --config=kvq4_lmv \
  --eval_data=../shared/data/wikitext-2-raw/wiki.test.raw
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.get_config()
  c.cache.k = base.kv(type='int', bits=4, scheme='asymmetric',
                      granularity='per_channel', group_size=32)
  c.cache.v = base.lloyd_max_kv(4)
  c.cache.key_rope = 'pre'
  c.cache.hadamard_v = True
  c.cache.rotation_seed = 0
  return c
