"""tqmix325: mixed-precision tq cache for issue 14's "<= 3.25 bits" row
(goal dPPL <= 1.5) on SmolLM2-135M-Instruct (30 layers; K and V of each
layer chosen separately among int5_lm, int4_lm, int3_lm, int2_lm).

Randomised Hadamard (seed 0) on K and V, keys before RoPE with the
calibrated key statistics (as `tq4`). Allocated for a stored budget of
3.17 bits/element (3.1667 achieved; the codebooks and key statistics
add the rest of the effective bits) by minimising the summed one-layer KL
probes of a sensitivity table measured on the LAST 4 windows of the text
(predicted KL +0.0881364);
per layer (K/V): L0 int2_lm/int3_lm, L1 int3_lm/int4_lm, L2 int3_lm/int3_lm,
L3 int4_lm/int3_lm, L4 int3_lm/int2_lm, L5 int3_lm/int2_lm, L6
int3_lm/int2_lm, L7 int3_lm/int2_lm, L8 int3_lm/int2_lm, L9 int3_lm/int2_lm,
L10 int3_lm/int3_lm, L11 int3_lm/int3_lm, L12 int4_lm/int3_lm, L13
int4_lm/int3_lm, L14 int4_lm/int2_lm, L15 int3_lm/int3_lm, L16
int4_lm/int3_lm, L17 int4_lm/int2_lm, L18 int3_lm/int3_lm, L19
int4_lm/int3_lm, L20 int4_lm/int3_lm, L21 int3_lm/int2_lm, L22
int3_lm/int2_lm, L23 int4_lm/int3_lm, L24 int4_lm/int3_lm, L25
int3_lm/int2_lm, L26 int3_lm/int2_lm, L27 int3_lm/int3_lm, L28
int2_lm/int2_lm, L29 int3_lm/int2_lm.

Measured (WikiText-2 test, first 40 windows x 512, second-half scoring,
float32, 2-core CPU; the verification sweep in WORKSPACE.md "Rotations,
Lloyd-Max codebooks and calibrated keys"): dPPL +2.439
[+2.135, +2.746] against baseline PPL 23.5115, KL 0.0945 ± 0.0018,
top-1 0.8175 ± 0.0043; effective 3.232 bits at 512 tokens, 3.175 at 4096.

Needs runs/key_stats/smollm2-135m (the command in configs/tq4.py).
Regenerate: experiments.layer_sensitivity + experiments.allocate
--budget=3.17 (WORKSPACE.md). Run: python -m experiments.run --config=tqmix325 \
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
  c.cache.k = base.lloyd_max_kv(3)
  c.cache.v = base.lloyd_max_kv(3)
  c.cache.layer_overrides = (
      '0:int2_lm/int3_lm;'
      '1:int3_lm/int4_lm;'
      '3,12,13,16,19,20,23,24:int4_lm/int3_lm;'
      '4,5,6,7,8,9,21,22,25,26,29:int3_lm/int2_lm;'
      '14,17:int4_lm/int2_lm;'
      '28:int2_lm/int2_lm')
  return c
