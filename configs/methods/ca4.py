"""ca4: keys at 4 bits per element on average with a width per native
channel (issue 34: transform coding's allocation without its basis), V
int4 Lloyd-Max codes + one bfloat16 scale per head vector after a
randomised Hadamard, the first token in bfloat16 (`configs/base.py`
`channel_widths_config`).

Keys before RoPE, each channel centred and scaled by its calibration mean
and std, 256 bits per key vector spread over its 64 channels (0..8 bits
each) by the calibrated query-weighted error tables, one codebook per
width, no scale, no rotation. Key statistics: built on first use for the
model being run and cached (`cache.key_stats = 'auto:mode=transform'`:
the last 4 windows of the text, disjoint from the evaluation), as
  python -m experiments.calibrate_keys --config=ca4 --mode=transform \\
      --workdir=runs/key_stats/smollm2-ca --config.eval.num_windows=40 \\
      --eval_data=../shared/data/wikitext-2-raw/wiki.test.raw

Measured on SmolLM2-135M-Instruct (first 40 windows of 512 of WikiText-2
test, second half scored; sweep `runs/issue34/sweep_alloc`, the command in
results/below_3.5_bits.md "Transform coding of keys", as `int4_st/int4_lm` under
`--config=tc3 --config.cache.key_stats=auto:mode=transform`): 4.26
effective bits per element at 512 tokens, 4.14 at 4096 (stored 4.125),
dPPL +0.49 [+0.34, +0.64] against the float32 cache, KL 0.0206
(other sweeps on the same windows: tc4 +0.33 at 4.82 / 4.21 bits, kq4 +0.65
at 4.21).

Run: python -m experiments.run --config=ca4 \\
  --eval_data=../shared/data/wikitext-2-raw/wiki.test.raw
"""

from __future__ import annotations

from configs import base


def get_config():
  return base.channel_widths_config(4, 4)
