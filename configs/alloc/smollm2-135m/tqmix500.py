"""tqmix500: issue 14's "<= 5.0 bits" row (goal dPPL <= 0.25) on
SmolLM2-135M-Instruct: the tq4 recipe (`base.rotated_codebook_config`) with
K and V bits chosen per layer among int5_lm..int2_lm (the overrides below)
by `experiments.allocate` (KL objective, stored budget 4.92, 4.9167
achieved, predicted KL +0.00827294) from one-layer probes on the LAST 4 windows
of the text.

Measured (WikiText-2 test, first 40 windows x 512, second-half scoring,
float32, 2-core CPU; the verification sweep in WORKSPACE.md "Rotations,
Lloyd-Max codebooks and calibrated keys"): dPPL +0.261
[+0.174, +0.348] against baseline PPL 23.5115, KL 0.0089 ± 0.0003,
top-1 0.9412 ± 0.0025; effective 4.988 bits at 512 tokens, 4.926 at 4096.

Key statistics: tq4's recipe, built on first use and cached
(configs/methods/tq4.py).
Regenerate: experiments.layer_sensitivity + experiments.allocate
--budget=4.92 (WORKSPACE.md). Run: python -m experiments.run --config=tqmix500 \
  --eval_data=../shared/data/wikitext-2-raw/wiki.test.raw
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.rotated_codebook_config(5, 4)
  c.cache.layer_overrides = (
      '0:int4_lm/int4_lm;'
      '1,2,3,11,12,13,16,18,19,23,24:int5_lm/int5_lm')
  c.made_for = "smollm2-135m"
  return c
