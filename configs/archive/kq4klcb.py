"""kq4klcb: kq4 with each layer's 16 static-key levels fitted to the
model's own next-token KL (issue 14, method 5, codebooks;
`kvq_jax/calibration/kl_fit.py`): Adam (32 steps, learning rate 0.002,
the keys' rounding differentiable in the levels) from kq4's uniform
levels in its calibrated ranges (ranges unchanged), on the LAST 16
windows of 512 of the text, disjoint from the evaluation windows. The
levels are a per-layer constant (16 float32 values) charged in the
effective bits. The fit lowered the KL on its own 16 windows from
0.02646 to 0.02470.

Measured (SmolLM2-135M-Instruct, WikiText-2 test, first 40 windows x 512,
second-half scoring, float32, 2-core CPU; sweep `runs/issue14/sweep_m5b`,
results/rotations_and_codebooks.md "KL-fitted codebooks and rotations"): dPPL +0.589 [+0.469,
+0.710] against baseline PPL 23.5115, KL 0.0288 ± 0.0012, top-1 0.8992 ±
0.0036; effective 4.216 bits at 512 tokens, 4.136 at 4096. kq4 in the same
run: +0.680 [+0.537, +0.823], KL 0.0273 ± 0.0008: the CIs overlap and the
KL is higher, so this is no measurable change, not a gain.

Needs kq4's key ranges (configs/methods/kq4.py), then the fit (420 s on the
2-core CPU):
  python -m experiments.fit_keys --config=kq4 --fit=codebook \\
      --learning_rate=0.002 \\
      --workdir=runs/key_stats/smollm2-135m-range-klcb2 \\
      --config.eval.num_windows=40 \\
      --eval_data=../shared/data/wikitext-2-raw/wiki.test.raw

Run: python -m experiments.run --config=kq4klcb \\
  --eval_data=../shared/data/wikitext-2-raw/wiki.test.raw

Archived: superseded by kq4: +0.589 [+0.469, +0.710] at 4.22 bits against kq4's +0.680 [+0.537, +0.823] in the same run: no measurable change; its key statistics are not shipped.
"""

from __future__ import annotations

from configs import base

SUPERSEDED_BY = 'kq4'


def get_config():
  return base.static_keys_config(4, 4,
                                 "runs/key_stats/smollm2-135m-range-klcb2")
