"""KIVI-4: K per-channel over 32-token groups, V per-token in groups of 32, asymmetric int4, 128-token full-precision residual: stored 5.0 bits/element, plus up to 159 (K) and 128 (V) bfloat16 tokens (effective bits below).

Measured (SmolLM2-135M-Instruct, Q4_1 GGUF weights; WikiText-2 test, first 40
windows x 512, second-half scoring, float32 compute, 2-core CPU; one sweep for
all presets, command in results/formats.md "Results"): dPPL −0.016 [−0.063, +0.031]
against baseline PPL 23.5115 (no measurable change), KL 0.00395 ± 0.00018,
top-1 0.9628 ± 0.0019; stored 5.00 bits/element, effective 8.08 at 512 tokens
and 5.39 at 4096. Full precision: K: up to 159 tokens (sinks 0, residual 128,
flush window 31); V: up to 128 tokens (sinks 0, residual 128, flush window 0),
in bfloat16.

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
