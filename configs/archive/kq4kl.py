"""kq4kl: kq4 with its key ranges fitted to the model's own next-token KL
(issue 14, method 5; `kvq_jax/calibration/kl_fit.py`): one log-ratio per
layer stretches or shrinks kq4's calibrated per-channel ranges, learned
with Adam (32 steps, learning rate 0.01, straight-through rounding) on the
LAST 16 windows of 512 of the text, disjoint from the evaluation windows.
The fit lowered the KL on its own 16 windows from 0.02636 to 0.02425 (the
ratios ended in [0.84, 1.07]: most layers clip harder) and is kept for
the record: on the evaluation windows it does NOT help.

Measured (SmolLM2-135M-Instruct, WikiText-2 test, first 40 windows x 512,
second-half scoring, float32, 2-core CPU; sweep `runs/issue14/sweep_m45`,
results/rotations_and_codebooks.md "Calibrated rotations and KL-fitted key ranges"): dPPL +0.732
[+0.562, +0.903] against baseline PPL 23.5115, KL 0.0295 ± 0.0014, top-1
0.9010 ± 0.0034; effective 4.213 bits at 512 tokens, 4.136 at 4096. kq4 in
the same run: +0.680 [+0.537, +0.823], KL 0.0273 ± 0.0008.

Needs kq4's key ranges (configs/methods/kq4.py), then the fit (200 s):
  python -m experiments.fit_keys --config=kq4 \\
      --workdir=runs/key_stats/smollm2-135m-range-kl \\
      --config.eval.num_windows=40 \\
      --eval_data=../shared/data/wikitext-2-raw/wiki.test.raw

Run: python -m experiments.run --config=kq4kl \\
  --eval_data=../shared/data/wikitext-2-raw/wiki.test.raw

Archived: superseded by kq4: +0.732 [+0.562, +0.903] at 4.21 bits against kq4's +0.680 in the same run: no measurable change, and its key statistics (runs/key_stats/smollm2-135m-range-kl) are not shipped.
"""

from __future__ import annotations

from configs import base

SUPERSEDED_BY = 'kq4'


def get_config():
  return base.static_keys_config(4, 4, "runs/key_stats/smollm2-135m-range-kl")
