"""tqmix425: mixed-precision tq cache for issue 14's "<= 4.25 bits" row
(goal dPPL <= 0.5) on SmolLM2-135M-Instruct (30 layers; K and V of each
layer chosen separately among int5_lm, int4_lm, int3_lm, int2_lm).

Randomised Hadamard (seed 0) on K and V, keys before RoPE with the
calibrated key statistics (as `tq4`). Allocated for a stored budget of
4.17 bits/element (4.1667 achieved; the codebooks and key statistics
add the rest of the effective bits) by minimising the summed one-layer KL
probes of a sensitivity table measured on the LAST 4 windows of the text
(predicted KL +0.0218975);
per layer (K/V): L0 int3_lm/int3_lm, L1 int4_lm/int5_lm, L2 int4_lm/int4_lm,
L3 int4_lm/int4_lm, L4 int4_lm/int3_lm, L5 int4_lm/int3_lm, L6
int4_lm/int3_lm, L7 int4_lm/int3_lm, L8 int4_lm/int3_lm, L9 int4_lm/int3_lm,
L10 int4_lm/int4_lm, L11 int4_lm/int4_lm, L12 int5_lm/int4_lm, L13
int5_lm/int4_lm, L14 int5_lm/int3_lm, L15 int5_lm/int3_lm, L16
int5_lm/int4_lm, L17 int4_lm/int4_lm, L18 int4_lm/int4_lm, L19
int5_lm/int4_lm, L20 int5_lm/int4_lm, L21 int5_lm/int3_lm, L22
int4_lm/int3_lm, L23 int5_lm/int4_lm, L24 int5_lm/int4_lm, L25
int4_lm/int3_lm, L26 int4_lm/int3_lm, L27 int4_lm/int4_lm, L28
int4_lm/int3_lm, L29 int4_lm/int3_lm.

Measured (WikiText-2 test, first 40 windows x 512, second-half scoring,
float32, 2-core CPU; the verification sweep in WORKSPACE.md "Rotations,
Lloyd-Max codebooks and calibrated keys"): dPPL +0.535
[+0.390, +0.681] against baseline PPL 23.5115, KL 0.0241 ± 0.0007,
top-1 0.9106 ± 0.0035; effective 4.235 bits at 512 tokens, 4.175 at 4096.

Needs runs/key_stats/smollm2-135m (the command in configs/tq4.py).
Regenerate: experiments.layer_sensitivity + experiments.allocate
--budget=4.17 (WORKSPACE.md). Run: python -m experiments.run --config=tqmix425 \
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
  c.cache.k = base.lloyd_max_kv(4)
  c.cache.v = base.lloyd_max_kv(3)
  c.cache.layer_overrides = (
      '0:int3_lm/int3_lm;'
      '1:int4_lm/int5_lm;'
      '2,3,10,11,17,18,27:int4_lm/int4_lm;'
      '12,13,16,19,20,23,24:int5_lm/int4_lm;'
      '14,15,21:int5_lm/int3_lm')
  return c
