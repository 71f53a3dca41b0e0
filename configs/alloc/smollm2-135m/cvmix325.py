"""cvmix325: issue 34's "<= 3.25 bits" row on SmolLM2-135M-Instruct: ca's
keys (int4_st / int3_st per layer: a width per native pre-RoPE channel, no
scale) with their calibrated shift and scale held in float16, and values
among int4_vq / int3_lm / int2_vq (after the randomised Hadamard) with a
bfloat16 or an 8-bit float8_e5m2 scale per vector (`_se5m2`), chosen by
`experiments.allocate` (KL objective, budget 3.25 effective bits at 512
tokens with every constant charged, 3.2488 achieved, predicted KL
+0.0491) from one-layer probes on the LAST 2 windows of the text
(runs/issue34c/smol_sens16, the table cvmix250 came from).

Measured (WikiText-2 test, first 40 windows x 512, second-half scoring,
float32, one core of the 2-core CPU, sweep runs/issue34c/smol_verify, one
baseline pass): dPPL +1.18 [+0.94, +1.42] against baseline PPL 23.5115,
KL 0.0614 ± 0.0014, top-1 0.855 ± 0.004; effective 3.25 bits at 512
tokens, 3.17 at 4096 (stored 3.15). Paired in the same run against the
preset it replaces (`git show 036d497:configs/alloc/smollm2-135m/cvmix325.py`, +1.46): ΔNLL
−0.0113 ± 0.0047 nats (z −2.4), KL −0.0101 ± 0.0012 (z −8.1).

Regenerate: as configs/alloc/smollm2-135m/cvmix250.py with --budget=3.25. Run: python -m
experiments.run --config=cvmix325
--eval_data=../shared/data/wikitext-2-raw/wiki.test.raw
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.channel_widths_mix(
      '0,13,16,19:int3_st/int3_lm;'
      '1:int4_st/int4_vq;'
      '2,3,10,20:int4_st/int3_lm;'
      '4,8:int4_st/int2_vq_se5m2;'
      '5,12,14,17,18,21,27:int3_st/int3_lm_se5m2;'
      '6,7,15,22,25,26:int3_st/int2_vq_se5m2;'
      '9,24,28:int4_st/int3_lm_se5m2;'
      '11,23:int3_st/int4_vq;'
      '29:int3_st/int2_vq', key_affine_dtype='float16')
  c.made_for = "smollm2-135m"
  return c
