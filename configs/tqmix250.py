"""tqmix250: mixed-precision tq cache for issue 14's "<= 2.5 bits" row
(goal dPPL <= 4.0) on SmolLM2-135M-Instruct (30 layers; K and V of each
layer chosen separately among int5_lm, int4_lm, int3_lm, int2_lm).

Randomised Hadamard (seed 0) on K and V, keys before RoPE with the
calibrated key statistics (as `tq4`). Allocated for a stored budget of
2.42 bits/element (2.4167 achieved; the codebooks and key statistics
add the rest of the effective bits) by minimising the summed one-layer KL
probes of a sensitivity table measured on the LAST 4 windows of the text
(predicted KL +0.266507);
per layer (K/V): L0 int2_lm/int2_lm, L1 int2_lm/int3_lm, L2 int2_lm/int2_lm,
L3 int3_lm/int2_lm, L4 int2_lm/int2_lm, L5 int2_lm/int2_lm, L6
int2_lm/int2_lm, L7 int2_lm/int2_lm, L8 int2_lm/int2_lm, L9 int3_lm/int2_lm,
L10 int2_lm/int2_lm, L11 int2_lm/int2_lm, L12 int2_lm/int2_lm, L13
int3_lm/int2_lm, L14 int2_lm/int2_lm, L15 int2_lm/int2_lm, L16
int2_lm/int2_lm, L17 int3_lm/int2_lm, L18 int3_lm/int2_lm, L19
int3_lm/int2_lm, L20 int2_lm/int2_lm, L21 int3_lm/int2_lm, L22
int2_lm/int2_lm, L23 int3_lm/int2_lm, L24 int3_lm/int2_lm, L25
int2_lm/int2_lm, L26 int2_lm/int2_lm, L27 int2_lm/int2_lm, L28
int2_lm/int2_lm, L29 int2_lm/int2_lm.

Measured (WikiText-2 test, first 40 windows x 512, second-half scoring,
float32, 2-core CPU; the verification sweep in WORKSPACE.md "Rotations,
Lloyd-Max codebooks and calibrated keys"): dPPL +9.457
[+8.635, +10.300] against baseline PPL 23.5115, KL 0.3160 ± 0.0078,
top-1 0.6926 ± 0.0057; effective 2.481 bits at 512 tokens, 2.425 at 4096.

Needs runs/key_stats/smollm2-135m (the command in configs/tq4.py).
Regenerate: experiments.layer_sensitivity + experiments.allocate
--budget=2.42 (WORKSPACE.md). Run: python -m experiments.run --config=tqmix250 \
  --eval_data=../shared/data/wikitext-2-raw/wiki.test.raw
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.get_config()
  c.cache.key_rope = 'pre'
  c.cache.hadamard_k = True
  c.cache.hadamard_v = True
  c.cache.rotation_seed = 0
  c.cache.key_stats = 'runs/key_stats/smollm2-135m'
  c.cache.k = base.lloyd_max_kv(2)
  c.cache.v = base.lloyd_max_kv(2)
  c.cache.layer_overrides = (
      '1:int2_lm/int3_lm;'
      '3,9,13,17,18,19,21,23,24:int3_lm/int2_lm')
  return c
