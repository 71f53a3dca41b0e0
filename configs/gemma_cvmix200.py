"""gemma_cvmix200: issue 34's "2.0 bits" row on Gemma 3 270M (18 layers, 1 kv
head of 256; layers 5, 11, 17 global, the rest sliding-window 512): ca's
keys (a width per native pre-RoPE channel, no scale) and values among
int4_vq / int3_lm / int2_vq / int1_vq, chosen by `experiments.allocate`
(KL objective, budget 2.0 effective bits at 512 tokens with every
constant charged, 1.9873 achieved, predicted KL +0.553) from one-layer
probes on the LAST 2 windows of the text: K int2_st in layers 2, 4, 7, 8, 9, 10, 15, 16, int3_st elsewhere; V int2_vq in layer 4, int1_vq elsewhere.

Verified in one sweep on 40 x 512 windows: runs/issue34/gemma_verify,
baseline PPL 17.40:
1.96 effective bits @512 (1.84 stored), dPPL +7.64 [+7.16, +8.12], KL 0.349, top-1 0.707
(WORKSPACE.md "Gemma 3 270M: allocated presets").

Regenerate (WORKSPACE.md "Gemma 3 270M: allocated presets"):
experiments.layer_sensitivity --config=ca3 --model=gemma3-270m --from_end
--noall_but_one --config.eval.num_windows=2 --k_formats=int4_st,int2_st
--v_formats=int2_vq,int4_vq, and again with --v_formats=int1_vq alone;
then experiments.allocate --metric=kl_mean over both tables with
--k_formats=int4_st,int3_st,int2_st
--v_formats=int4_vq,int3_lm,int2_vq,int1_vq --budget=2.0. Key
statistics: ca3's for Gemma 3, built on first use and cached. Run:
python -m experiments.run --config=gemma_cvmix200
--eval_data=../shared/data/wikitext-2-raw/wiki.test.raw
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.channel_widths_mix(
      '0,1,3,5,6,11,12,13,14,17:int3_st/int1_vq;'
      '2,7,8,9,10,15,16:int2_st/int1_vq;'
      '4:int2_st/int2_vq')
  c.model = "gemma3-270m"
  return c
