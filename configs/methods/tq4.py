"""tq4: K and V int4 Lloyd-Max codes + one bfloat16 scale per head
vector after a randomised Hadamard rotation; keys before RoPE, shifted and
scaled per channel by calibrated statistics (`configs/base.py`
`rotated_codebook_config`). Stored 4.25 bits/element, no full-precision token.

Measured (SmolLM2-135M-Instruct, WikiText-2 test, first 40 windows x 512,
second-half scoring, float32, 2-core CPU; the issue-14 sweep in WORKSPACE.md
"Rotations, Lloyd-Max codebooks and calibrated keys"): dPPL +0.546 [+0.406, +0.687]
against baseline PPL 23.5115, KL 0.0251 ± 0.0007, top-1 0.9027 ± 0.0028;
effective 4.318 bits at 512 tokens, 4.258 at 4096 (codebooks and key
statistics charged).

Key statistics: built on first use for the model being run and cached
(`cache.key_stats = 'auto'`: the last 4 windows of the text, disjoint
from the evaluation; `kvq_jax/calibration/auto_key_stats.py`), the same
as this command writes explicitly (10 s):
  python -m experiments.calibrate_keys --config=tq4 \
      --workdir=runs/key_stats/smollm2-135m --config.eval.num_windows=40 \
      --eval_data=../shared/data/wikitext-2-raw/wiki.test.raw
An explicit --config.cache.key_stats=DIR wins (refused if made for
another model).

Run: python -m experiments.run --config=tq4 \
  --eval_data=../shared/data/wikitext-2-raw/wiki.test.raw
"""

from __future__ import annotations

from configs import base


def get_config():
  return base.rotated_codebook_config(4, 4)
