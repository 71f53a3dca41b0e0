"""kqmix250: issue 14's "<= 2.5 bits" row (goal dPPL <= 4.0) on
SmolLM2-135M-Instruct, allocated as kqmix325 (same sensitivity table and
candidates) at a stored budget of 2.4 bits (2.3979 achieved, predicted KL
+0.21704).

Measured on the first 40 windows x 512 of WikiText-2 test (second half,
float32, this 2-core CPU; WORKSPACE.md, the kq allocation table): dPPL
+7.555 [+6.962, +8.159] against baseline 23.5115, KL 0.2589 ± 0.0065,
top-1 0.7170 ± 0.0053; effective 2.487 bits at 512 tokens, 2.409 at
4096. tqmix250: +9.46 at 2.48 bits, KL 0.316.

Archived: superseded by cvmix250: +7.56 [+6.96, +8.16] at 2.49 bits against cvmix250's +3.99 [+3.55, +4.45] at 2.50 (same windows, separate sweeps; the first cvmix250 was already −0.063 ± 0.009 nats paired against kqmix250).
"""

from __future__ import annotations

from configs import base

SUPERSEDED_BY = 'cvmix250'


def get_config():
  c = base.static_keys_mix(2, (
      '1:int2_st_o1/int3_lm;'
      '3:int3_st_o1/int2_lm;'
      '8,17,18,20,23:int3_st/int2_lm'))
  c.made_for = "smollm2-135m"
  return c
