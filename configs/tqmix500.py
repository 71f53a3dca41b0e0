"""tqmix500: mixed-precision tq cache for issue 14's "<= 5.0 bits" row
(goal dPPL <= 0.25) on SmolLM2-135M-Instruct (30 layers; K and V of each
layer chosen separately among int5_lm, int4_lm, int3_lm, int2_lm).

Randomised Hadamard (seed 0) on K and V, keys before RoPE with the
calibrated key statistics (as `tq4`). Allocated for a stored budget of
4.92 bits/element (4.9167 achieved; the codebooks and key statistics
add the rest of the effective bits) by minimising the summed one-layer KL
probes of a sensitivity table measured on the LAST 4 windows of the text
(predicted KL +0.00827294);
per layer (K/V): L0 int4_lm/int4_lm, L1 int5_lm/int5_lm, L2 int5_lm/int5_lm,
L3 int5_lm/int5_lm, L4 int5_lm/int4_lm, L5 int5_lm/int4_lm, L6
int5_lm/int4_lm, L7 int5_lm/int4_lm, L8 int5_lm/int4_lm, L9 int5_lm/int4_lm,
L10 int5_lm/int4_lm, L11 int5_lm/int5_lm, L12 int5_lm/int5_lm, L13
int5_lm/int5_lm, L14 int5_lm/int4_lm, L15 int5_lm/int4_lm, L16
int5_lm/int5_lm, L17 int5_lm/int4_lm, L18 int5_lm/int5_lm, L19
int5_lm/int5_lm, L20 int5_lm/int4_lm, L21 int5_lm/int4_lm, L22
int5_lm/int4_lm, L23 int5_lm/int5_lm, L24 int5_lm/int5_lm, L25
int5_lm/int4_lm, L26 int5_lm/int4_lm, L27 int5_lm/int4_lm, L28
int5_lm/int4_lm, L29 int5_lm/int4_lm.

Measured (WikiText-2 test, first 40 windows x 512, second-half scoring,
float32, 2-core CPU; the verification sweep in WORKSPACE.md "Rotations,
Lloyd-Max codebooks and calibrated keys"): dPPL +0.261
[+0.174, +0.348] against baseline PPL 23.5115, KL 0.0089 ± 0.0003,
top-1 0.9412 ± 0.0025; effective 4.988 bits at 512 tokens, 4.926 at 4096.

Needs runs/key_stats/smollm2-135m (the command in configs/tq4.py).
Regenerate: experiments.layer_sensitivity + experiments.allocate
--budget=4.92 (WORKSPACE.md). Run: python -m experiments.run --config=tqmix500 \
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
  c.cache.k = base.lloyd_max_kv(5)
  c.cache.v = base.lloyd_max_kv(4)
  c.cache.layer_overrides = (
      '0:int4_lm/int4_lm;'
      '1,2,3,11,12,13,16,18,19,23,24:int5_lm/int5_lm')
  return c
