"""tqmix250: issue 14's "<= 2.5 bits" row (goal dPPL <= 4.0) on
SmolLM2-135M-Instruct: the tq4 recipe (`base.rotated_codebook_config`) with
K and V bits chosen per layer among int5_lm..int2_lm (the overrides below)
by `experiments.allocate` (KL objective, stored budget 2.42, 2.4167
achieved, predicted KL +0.266507) from one-layer probes on the LAST 4 windows
of the text.

Measured (WikiText-2 test, first 40 windows x 512, second-half scoring,
float32, 2-core CPU; the verification sweep in WORKSPACE.md "Rotations,
Lloyd-Max codebooks and calibrated keys"): dPPL +9.457
[+8.635, +10.300] against baseline PPL 23.5115, KL 0.3160 ± 0.0078,
top-1 0.6926 ± 0.0057; effective 2.481 bits at 512 tokens, 2.425 at 4096.

Key statistics: tq4's recipe, built on first use and cached
(configs/methods/tq4.py).
Regenerate: experiments.layer_sensitivity + experiments.allocate
--budget=2.42 (WORKSPACE.md). Run: python -m experiments.run --config=tqmix250 \
  --eval_data=../shared/data/wikitext-2-raw/wiki.test.raw

Archived: superseded by cvmix250: +9.46 [+8.63, +10.30] at 2.48 bits against cvmix250's +3.99 [+3.55, +4.45] at 2.50 (results/rotations_and_codebooks.md and cvmix250's docstring; each from a 40 x 512 WikiText-2 sweep on the same windows, not one paired run).
"""

from __future__ import annotations

from configs import base

SUPERSEDED_BY = 'cvmix250'


def get_config():
  c = base.rotated_codebook_config(2, 2)
  c.cache.layer_overrides = (
      '1:int2_lm/int3_lm;'
      '3,9,13,17,18,19,21,23,24:int3_lm/int2_lm')
  c.made_for = "smollm2-135m"
  return c
