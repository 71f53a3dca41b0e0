"""tqmix325: issue 14's "<= 3.25 bits" row (goal dPPL <= 1.5) on
SmolLM2-135M-Instruct: the tq4 recipe (`base.rotated_codebook_config`) with
K and V bits chosen per layer among int5_lm..int2_lm (the overrides below)
by `experiments.allocate` (KL objective, stored budget 3.17, 3.1667
achieved, predicted KL +0.0881364) from one-layer probes on the LAST 4 windows
of the text.

Measured (WikiText-2 test, first 40 windows x 512, second-half scoring,
float32, 2-core CPU; the verification sweep in WORKSPACE.md "Rotations,
Lloyd-Max codebooks and calibrated keys"): dPPL +2.439
[+2.135, +2.746] against baseline PPL 23.5115, KL 0.0945 ± 0.0018,
top-1 0.8175 ± 0.0043; effective 3.232 bits at 512 tokens, 3.175 at 4096.

Key statistics: tq4's recipe, built on first use and cached
(configs/methods/tq4.py).
Regenerate: experiments.layer_sensitivity + experiments.allocate
--budget=3.17 (WORKSPACE.md). Run: python -m experiments.run --config=tqmix325 \
  --eval_data=../shared/data/wikitext-2-raw/wiki.test.raw

Archived: superseded by cvmix325: +2.44 [+2.13, +2.75] at 3.23 bits against cvmix325's +1.18 [+0.94, +1.42] at 3.25 (same windows, separate sweeps).
"""

from __future__ import annotations

from configs import base

SUPERSEDED_BY = 'cvmix325'


def get_config():
  c = base.rotated_codebook_config(3, 3)
  c.cache.layer_overrides = (
      '0:int2_lm/int3_lm;'
      '1:int3_lm/int4_lm;'
      '3,12,13,16,19,20,23,24:int4_lm/int3_lm;'
      '4,5,6,7,8,9,21,22,25,26,29:int3_lm/int2_lm;'
      '14,17:int4_lm/int2_lm;'
      '28:int2_lm/int2_lm')
  c.made_for = "smollm2-135m"
  return c
