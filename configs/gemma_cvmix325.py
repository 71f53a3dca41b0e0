"""gemma_cvmix325: issue 34's "<= 3.25 bits" row on Gemma 3 270M (18 layers, 1 kv
head of 256; layers 5, 11, 17 global, the rest sliding-window 512): ca's
keys (a width per native pre-RoPE channel, no scale) and values among
int4_vq / int3_lm / int2_vq / int1_vq, chosen by `experiments.allocate`
(KL objective, budget 3.25 effective bits at 512 tokens with every
constant charged, 3.2318 achieved, predicted KL +0.0565) from one-layer
probes on the LAST 2 windows of the text: K int3_st in every layer; V int4_vq in layers 1, 3, 8, 11, int2_vq in 16, 17, int3_lm elsewhere.

Verified in one sweep on 40 x 512 windows: runs/issue34/gemma_verify,
baseline PPL 17.40:
3.21 effective bits @512 (3.09 stored), dPPL +0.78 [+0.63, +0.94], KL 0.0449, top-1 0.893
(WORKSPACE.md "Gemma 3 270M: allocated presets").

Allocated from key probes that ran int4_st/int2_st as bare uniform codes
(fixed in 7d4b06d). Re-allocated from the fixed probes (runs/issue34b,
WORKSPACE.md "Probes that measure what runs"): +0.74 at 3.21 bits, paired
−0.0026 ± 0.0029 nats against this preset, no measurable change; kept.

Regenerate (WORKSPACE.md "Gemma 3 270M: allocated presets"):
experiments.layer_sensitivity --config=ca3 --model=gemma3-270m --from_end
--noall_but_one --config.eval.num_windows=2 --k_formats=int4_st,int2_st
--v_formats=int2_vq,int4_vq, and again with --v_formats=int1_vq alone;
then experiments.allocate --metric=kl_mean over both tables with
--k_formats=int4_st,int3_st,int2_st
--v_formats=int4_vq,int3_lm,int2_vq,int1_vq --budget=3.25. Key
statistics: ca3's for Gemma 3, built on first use and cached. Run:
python -m experiments.run --config=gemma_cvmix325
--eval_data=../shared/data/wikitext-2-raw/wiki.test.raw
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.channel_widths_mix(
      '0,2,4,5,6,7,9,10,12,13,14,15:int3_st/int3_lm;'
      '1,3,8,11:int3_st/int4_vq;'
      '16,17:int3_st/int2_vq')
  c.model = "gemma3-270m"
  return c
