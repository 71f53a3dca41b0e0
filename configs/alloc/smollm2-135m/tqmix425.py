"""tqmix425: issue 14's "<= 4.25 bits" row (goal dPPL <= 0.5) on
SmolLM2-135M-Instruct: the tq4 recipe (`base.rotated_codebook_config`) with
K and V bits chosen per layer among int5_lm..int2_lm (the overrides below)
by `experiments.allocate` (KL objective, stored budget 4.17, 4.1667
achieved, predicted KL +0.0218975) from one-layer probes on the LAST 4 windows
of the text.

Measured (WikiText-2 test, first 40 windows x 512, second-half scoring,
float32, 2-core CPU; the verification sweep in WORKSPACE.md "Rotations,
Lloyd-Max codebooks and calibrated keys"): dPPL +0.535
[+0.390, +0.681] against baseline PPL 23.5115, KL 0.0241 ± 0.0007,
top-1 0.9106 ± 0.0035; effective 4.235 bits at 512 tokens, 4.175 at 4096.

Key statistics: tq4's recipe, built on first use and cached
(configs/methods/tq4.py).
Regenerate: experiments.layer_sensitivity + experiments.allocate
--budget=4.17 (WORKSPACE.md). Run: python -m experiments.run --config=tqmix425 \
  --eval_data=../shared/data/wikitext-2-raw/wiki.test.raw
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.rotated_codebook_config(4, 3)
  c.cache.layer_overrides = (
      '0:int3_lm/int3_lm;'
      '1:int4_lm/int5_lm;'
      '2,3,10,11,17,18,27:int4_lm/int4_lm;'
      '12,13,16,19,20,23,24:int5_lm/int4_lm;'
      '14,15,21:int5_lm/int3_lm')
  c.made_for = "smollm2-135m"
  return c
