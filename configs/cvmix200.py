"""cvmix200: issue 34's "2.0 bits" row on SmolLM2-135M-Instruct: ca's keys
(int3_st or int2_st per layer: a width per native pre-RoPE channel, no
scale) and vector-coded values (int3_lm, int2_vq or int1_vq: one 8-bit
index per 4 or 8 elements after the randomised Hadamard, a bfloat16 scale
per vector), chosen by `experiments.allocate` (KL objective, budget 2.0
effective bits at 512 tokens with every constant charged, 1.9956
achieved, predicted KL +0.288) from one-layer probes on the LAST 2
windows of the text, extra key formats probed as the layer stores them
(fixed in 7d4b06d): K int3_st in layers 2, 3, int2_st elsewhere; V
int3_lm in layer 1, int2_vq in 0, 2, 3, 11, 13, 14, 16, 19, 20, 23, 24,
int1_vq elsewhere.

Measured (WikiText-2 test, first 40 windows x 512, second-half scoring,
float32, one core of the 2-core CPU, sweep runs/issue34b/smol_verify, one
baseline pass): dPPL +13.3 [+12.5, +14.2] against baseline PPL 23.5115,
KL 0.440 ± 0.009, top-1 0.638 ± 0.007; effective 2.00 bits at 512 tokens
(stored 1.88). Paired in the same run: ΔNLL −0.266 ± 0.011 nats (z −24.9)
against the allocation made from the uniform key probes (`git show
de6b39c:configs/cvmix200.py`, +24.6 [+23.0, +26.2]). Still a 2-bit row,
not a usable cache.

Regenerate: as cvmix250 (the same table) with --budget=2.0. Run: python
-m experiments.run --config=cvmix200
--eval_data=../shared/data/wikitext-2-raw/wiki.test.raw
"""

from __future__ import annotations

from configs import base


def get_config():
  return base.channel_widths_mix(
      '0,11,13,14,16,19,20,23,24:int2_st/int2_vq;'
      '1:int2_st/int3_lm;'
      '2,3:int3_st/int2_vq;'
      '4,5,6,7,8,9,10,12,15,17,18,21,22,25,26,27,28,29:int2_st/int1_vq')
