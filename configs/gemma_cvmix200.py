"""gemma_cvmix200: issue 34's "2.0 bits" row on Gemma 3 270M (18 layers, 1
kv head of 256; layers 5, 11, 17 global, the rest sliding-window 512):
ca's keys and vector-coded values as gemma_cvmix250, allocated at a
budget of 2.0 effective bits (1.9790 achieved, predicted KL +0.272): K
int3_st in layer 2, int2_st elsewhere; V int1_vq in layers 5, 6, 7, 9,
14, 15, 16, 17, int2_vq elsewhere.

Verified as gemma_cvmix250 (the same sweep): 1.96 effective bits @512
(1.84 stored), dPPL +4.35 [+3.97, +4.75], KL 0.230, top-1 0.751. Against
the allocation made from the uniform key probes (`git show
de6b39c:configs/gemma_cvmix200.py`, +7.64): ΔNLL −0.141 ± 0.010 nats
(z −13.9).

Regenerate: as gemma_cvmix250 (the same two tables) with --budget=2.0.
Run: python -m experiments.run --config=gemma_cvmix200
--eval_data=../shared/data/wikitext-2-raw/wiki.test.raw
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.channel_widths_mix(
      '0,1,3,4,8,10,11,12,13:int2_st/int2_vq;'
      '2:int3_st/int2_vq;'
      '5,6,7,9,14,15,16,17:int2_st/int1_vq')
  c.model = "gemma3-270m"
  return c
