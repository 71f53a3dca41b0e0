"""llama.cpp q4_0 K and V (-ctk q4_0 -ctv q4_0): 4.5 bits/element, bit-exact values.

Blocks of 32 along head_dim with llama.cpp's Q4_0 arithmetic:
d = m / -8 in float32 (m: the signed value of largest magnitude), code =
trunc(x * (1 / d) + 8.5) clipped to 0..15 (all 16 codes), d stored as
float16 rounded to nearest.
quantize -> dequantize equals gguf-py's quants.quantize -> quants.dequantize
element for element (tests/quant/test_ggml_exact.py). int4, scheme=symmetric,
rounding='ggml'; no full-precision residual, every token committed to the
quantized cache as it is written (flush_block 1).

Measured (SmolLM2-135M-Instruct, Q4_1 GGUF weights; WikiText-2 test, first 40
windows x 512, second-half scoring, float32 compute, 2-core CPU; one sweep for
all presets, command in results/formats.md "Results"): dPPL +2.75 [+2.41, +3.10]
against baseline PPL 23.5115, KL 0.0906 ± 0.0027, top-1 0.8289 ± 0.0039; stored
4.50 bits/element, effective 4.50 at 512 tokens and 4.50 at 4096. Full
precision: K: none; V: none.

Run: python -m experiments.run --config=q4_0
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.get_config()
  c.cache.k = base.ggml_kv('q4_0')
  c.cache.v = base.ggml_kv('q4_0')
  return c
