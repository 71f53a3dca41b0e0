"""kvq4 — our 5-bit recipe: keys int4 asymmetric per-channel over 32-token
groups, quantized BEFORE RoPE (RoPE applied after dequantization, KVQuant);
values int4 asymmetric in groups of 32 along head_dim after a Hadamard
rotation. 5.0 bits/element, no full-precision residual or sinks.

Keys carry per-channel outliers that RoPE smears across channels; grouping
them per channel before RoPE keeps each group's range tight. The last,
incomplete 32-token group of keys stays full precision until it closes
(flush_block = 32).

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
