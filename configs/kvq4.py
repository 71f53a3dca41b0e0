"""kvq4 — our 5-bit recipe: keys int4 asymmetric per-channel over 32-token
groups, quantized BEFORE RoPE (RoPE applied after dequantization, KVQuant);
values int4 asymmetric in groups of 32 along head_dim after a Hadamard
rotation. 5.0 bits/element, no full-precision residual or sinks.

Keys carry per-channel outliers that RoPE smears across channels; grouping
them per channel before RoPE keeps each group's range tight. Key groups
close every 32 tokens, so the newest 0-31 tokens (K and V) stay full
precision until their group is flushed (flush_block = 32): a fixed
31-slot buffer per layer, not a per-token cost.

Measured (SmolLM2-135M-Instruct, WikiText-2 test, 40 windows x 512, second-half
scoring, float32 compute, 2-core CPU): PPL 23.5917 vs baseline 23.5115
(dPPL +0.0802), KL 0.00575, top-1 0.9576, 5.000 bits/element,
7200 bytes/token over 30 layers (measured from the cache leaves).

Run: python -m experiments.run --config=kvq4
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.get_config()
  c.cache.k = base.kv(type='int', bits=4, scheme='asymmetric',
                      granularity='per_channel', group_size=32)
  c.cache.v = base.kv(type='int', bits=4, scheme='asymmetric', group_size=32)
  c.cache.key_rope = 'pre'
  c.cache.hadamard_v = True
  return c
