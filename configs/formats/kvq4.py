"""kvq4: keys int4 asymmetric per-channel over 32-token groups, quantized
BEFORE RoPE (RoPE applied after dequantization, KVQuant); values int4
asymmetric in groups of 32 along head_dim after a Hadamard rotation.
Stored 5.0 bits/element.

Full precision: per-channel key groups close every 32 tokens, so up to 31
of the newest keys per layer wait in bfloat16 (a fixed 31-slot buffer,
charged in the effective bits); values are token-local and are committed to
int4 storage as they are written (no value is held in full precision).

Measured (SmolLM2-135M-Instruct, Q4_1 GGUF weights; WikiText-2 test, first 40
windows x 512, second-half scoring, float32 compute, 2-core CPU; one sweep for
all presets, command in results/formats.md "Results"): dPPL +0.207 [+0.121, +0.294]
against baseline PPL 23.5115, KL 0.00934 ± 0.00032, top-1 0.9416 ± 0.0024;
stored 5.00 bits/element, effective 5.33 at 512 tokens and 5.04 at 4096. Full
precision: K: up to 31 tokens (sinks 0, residual 0, flush window 31); V: none,
in bfloat16.

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
