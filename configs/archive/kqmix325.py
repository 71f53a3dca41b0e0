"""kqmix325: issue 14's "<= 3.25 bits" row (goal dPPL <= 1.5) on
SmolLM2-135M-Instruct: the kq recipe (`base.static_keys_config`: static keys
in calibrated per-channel ranges with one outlier per vector, rotated
Lloyd-Max values, one bfloat16 sink token) with K among int4_st_o1,
int3_st_o1, int3_st, int2_st_o1 and int3_st_o1_clip0.85 and V among
int4_lm..int2_lm chosen per layer by `experiments.allocate` (KL objective,
stored budget 3.15, 3.1500 achieved, predicted KL +0.0750692) from one-layer
probes on the LAST 4 windows of the text.

Measured (WikiText-2 test, first 40 windows x 512, second-half scoring,
float32, 2-core CPU; the verification sweep in WORKSPACE.md "Rotations,
Lloyd-Max codebooks and calibrated keys"): dPPL +2.275 [+2.005, +2.547] against baseline
PPL 23.5115, KL 0.0875 ± 0.0028, top-1 0.8317 ± 0.0043; effective 3.238 bits at 512 tokens,
3.161 at 4096. tqmix325 (the tq recipe allocated the same way): +2.439 at 3.232
bits, KL 0.0945.

Key ranges: kq3's recipe, built on first use and cached (configs/methods/kq3.py).
Regenerate: experiments.layer_sensitivity --config=kq3 + experiments.allocate
--budget=3.15 (WORKSPACE.md). Run: python -m experiments.run
--config=kqmix325 --eval_data=../shared/data/wikitext-2-raw/wiki.test.raw

Archived: superseded by cvmix325: +2.28 [+2.01, +2.55] at 3.24 bits against cvmix325's +1.18 [+0.94, +1.42] at 3.25 (same windows, separate sweeps).
"""

from __future__ import annotations

from configs import base

SUPERSEDED_BY = 'cvmix325'


def get_config():
  c = base.static_keys_mix(3, (
      '0,27:int2_st_o1/int3_lm;'
      '1:int3_st_o1/int4_lm;'
      '3,17,20,23,24:int4_st_o1/int3_lm;'
      '4,6,7,26,28:int3_st_o1/int2_lm;'
      '8:int4_st_o1/int2_lm;'
      '11,12,14,16,18,19,22:int3_st/int3_lm;'
      '13:int3_st_o1_clip0.85/int3_lm;'
      '15,21,25:int3_st/int2_lm;'
      '29:int2_st_o1/int2_lm'))
  c.made_for = "smollm2-135m"
  return c
