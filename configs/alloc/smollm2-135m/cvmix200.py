"""cvmix200: issue 34's "2.0 bits" row on SmolLM2-135M-Instruct: ca's keys
(int3_st or int2_st per layer: a width per native pre-RoPE channel, no
scale) with their calibrated shift and scale held in float16, and
vector-coded values (int3_lm, int2_vq or int1_vq after the randomised
Hadamard, a bfloat16 or an 8-bit float8_e5m2 scale per vector), chosen by
`experiments.allocate` (KL objective, budget 2.0 effective bits at 512
tokens with every constant charged, 1.9997 achieved, predicted KL
+0.253) from one-layer probes on the LAST 2 windows of the text
(runs/issue34c/smol_sens16, the table cvmix250 came from).

Measured (WikiText-2 test, first 40 windows x 512, second-half scoring,
float32, one core of the 2-core CPU, sweep runs/issue34c/smol_verify, one
baseline pass): dPPL +11.1 [+10.4, +11.8] against baseline PPL 23.5115,
KL 0.384 ± 0.008, top-1 0.653 ± 0.006; effective 2.00 bits at 512 tokens,
1.92 at 4096 (stored 1.91). Paired in the same run against the preset it
replaces (`git show 036d497:configs/alloc/smollm2-135m/cvmix200.py`, +13.3): ΔNLL −0.063 ±
0.006 nats (z −11.3), KL −0.056 ± 0.004. Still a 2-bit row, not a
usable cache.

Regenerate: as configs/alloc/smollm2-135m/cvmix250.py with --budget=2.0. Run: python -m
experiments.run --config=cvmix200
--eval_data=../shared/data/wikitext-2-raw/wiki.test.raw
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.channel_widths_mix(
      '0,5,10,12,13,14,16,17,23,27:int2_st/int2_vq_se5m2;'
      '1:int2_st/int3_lm;'
      '2:int3_st/int2_vq_se5m2;'
      '3:int3_st/int2_vq;'
      '4,6,7,8,15,18,21,22,25,26,28,29:int2_st/int1_vq_se5m2;'
      '9:int2_st/int1_vq;'
      '11,19,20,24:int2_st/int2_vq', key_affine_dtype='float16')
  c.made_for = "smollm2-135m"
  return c
