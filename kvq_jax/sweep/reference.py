"""llama.cpp's KV-cache perplexities, the reference points of the sweep plot.

The numbers quoted in issue 5: llama.cpp perplexity of SmolLM2-135M-Instruct
(kvq_jax's `smollm2-135m`) with each cache type
(`-ctk/-ctv`; the last row is K q8_0 + V q4_0) on 40 windows of 512 tokens
of WikiText-2 raw test, the same windows a sweep with
`--eval_data=.../wiki.test.raw --config.eval.num_windows=40` scores. Bits
per element include the block scales (q8_0: 34 bytes per 32 values). They
are plotted as delta PPL against llama.cpp's own f16 cache.

`kvq_point` names the kvq_jax point that stores the same values
(configs/formats/q8_0.py ... q5_1.py, checked value for value against gguf-py in
tests/quant/test_ggml_exact.py; `q8_0/q4_0` is the K q8_0 + V q4_0 point),
so a results table can print llama.cpp's ΔPPL beside ours when the
evaluation follows the same protocol (`matches_llama_cpp_protocol`).
"""

from __future__ import annotations

import dataclasses
import pathlib


@dataclasses.dataclass(frozen=True)
class ReferencePoint:
  name: str
  bits_per_element: float
  ppl: float
  kvq_point: str | None = None  # The kvq_jax point with the same values.


LLAMA_CPP_F16_PPL = 23.578
LLAMA_CPP_PROTOCOL = "llama.cpp, WikiText-2, 40 windows of 512"
# The protocol in kvq_jax's terms: `llama-perplexity` scores the second half
# of each 512-token chunk (255 predictions), as `scoring="second_half"` does.
LLAMA_CPP_MODEL = "smollm2-135m"
LLAMA_CPP_DATA_FILE = "wiki.test.raw"
LLAMA_CPP_NUM_WINDOWS = 40
LLAMA_CPP_WINDOW_LEN = 512
LLAMA_CPP_SCORING = "second_half"

LLAMA_CPP_POINTS = (
    ReferencePoint("f16", 16.0, 23.578),
    ReferencePoint("q8_0", 8.5, 23.582, "q8_0"),
    ReferencePoint("q5_1", 6.0, 24.055, "q5_1"),
    ReferencePoint("q5_0", 5.5, 24.399, "q5_0"),
    ReferencePoint("q4_1", 5.0, 25.454, "q4_1"),
    ReferencePoint("iq4_nl", 4.5, 25.774),
    ReferencePoint("q4_0", 4.5, 27.805, "q4_0"),
    ReferencePoint("K q8_0 + V q4_0", 6.5, 23.831, "q8_0/q4_0"),
)


def llama_cpp_delta_ppl(point: ReferencePoint) -> float:
  """The point's PPL minus llama.cpp's own f16 cache PPL."""
  return point.ppl - LLAMA_CPP_F16_PPL


def llama_cpp_point_for(kvq_point: str) -> ReferencePoint | None:
  """llama.cpp's point with the same values as kvq_jax's `kvq_point`."""
  for point in LLAMA_CPP_POINTS:
    if point.kvq_point == kvq_point:
      return point
  return None


def matches_llama_cpp_protocol(model: str, data: str | None,
                               num_windows: int, window_len: int,
                               scoring: str) -> bool:
  """Whether an evaluation scored the model and windows llama.cpp's did.

  `data` is the evaluation file's path (any folder; its name must be
  wiki.test.raw), or None where the run did not record it (sweeps before
  run_info.json's eval_data): then the model, windows and scoring are
  checked.
  """
  if data is not None and pathlib.PurePath(data).name != LLAMA_CPP_DATA_FILE:
    return False
  return (model, num_windows, window_len, scoring) == (
      LLAMA_CPP_MODEL, LLAMA_CPP_NUM_WINDOWS, LLAMA_CPP_WINDOW_LEN,
      LLAMA_CPP_SCORING)
