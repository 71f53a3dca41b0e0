"""Benchmark workloads: requests drawn from a corpus, and their arrivals.

Prompts are windows of the corpus's token ids at seeded offsets, so every
cache kind is served the same requests. Lengths are fixed, or drawn per
request uniformly from [L / 2, 3 L / 2] (seeded); a shared prefix puts the
same first `shared_prefix_len` tokens (the corpus's first) in front of
every prompt. Arrivals: `all` at time 0 (offline throughput) or
`poisson:RATE`, exponential gaps of mean 1 / RATE seconds (online).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from kvq_jax.serving.request import Request

LENGTHS = ("fixed", "uniform")


def parse_arrival(text: str) -> float | None:
  """None for 'all', else the rate of 'poisson:RATE' (> 0 requests/s)."""
  if text == "all":
    return None
  head, _, rate = text.partition(":")
  try:
    value = float(rate)
  except ValueError:
    value = None
  if head != "poisson" or value is None or not value > 0:
    raise ValueError(f"--arrival={text!r}: allowed: 'all' or 'poisson:RATE' "
                     "with RATE > 0 requests per second.")
  return value


@dataclasses.dataclass(frozen=True)
class Workload:
  """What `make_requests` draws (module docstring)."""

  num_requests: int
  prompt_len: int
  output_len: int
  lengths: str = "fixed"
  arrival: str = "all"
  shared_prefix_len: int = 0
  seed: int = 0
  ignore_eos: bool = True

  def __post_init__(self):
    for name in ("num_requests", "prompt_len", "output_len"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"Workload.{name}={value!r}: allowed: an int >= 1.")
    if self.lengths not in LENGTHS:
      raise ValueError(f"Workload.lengths={self.lengths!r}: allowed: "
                       f"{', '.join(LENGTHS)}.")
    if not 0 <= self.shared_prefix_len < self.prompt_len:
      raise ValueError(
          f"Workload.shared_prefix_len={self.shared_prefix_len}: allowed: "
          f"0 <= it < prompt_len = {self.prompt_len}.")
    parse_arrival(self.arrival)

  @property
  def max_tokens(self) -> int:
    """The longest request: prompt + output at the top of the draw."""
    scale = 1.5 if self.lengths == "uniform" else 1.0
    return int(self.prompt_len * scale) + int(self.output_len * scale)

  def label(self) -> str:
    return (f"prompt {self.prompt_len}, output {self.output_len} "
            f"({self.lengths}), {self.num_requests} requests, arrival "
            f"{self.arrival}, shared prefix {self.shared_prefix_len}")


def make_requests(workload: Workload, ids: np.ndarray) -> list[Request]:
  """The workload's requests over corpus token ids `ids` (1-D)."""
  w = workload
  rng = np.random.default_rng(w.seed)
  draw = lambda n: (n if w.lengths == "fixed" else
                    int(rng.integers(max(1, n // 2), n + n // 2 + 1)))
  prefix = [int(t) for t in ids[:w.shared_prefix_len]]
  rate = parse_arrival(w.arrival)
  clock = 0.0
  out = []
  for i in range(w.num_requests):
    prompt_len, output_len = draw(w.prompt_len), draw(w.output_len)
    own = max(1, prompt_len - len(prefix))
    if len(ids) < own + w.shared_prefix_len + 1:
      raise ValueError(f"the corpus has {len(ids)} tokens; a prompt needs "
                       f"{own + w.shared_prefix_len + 1}.")
    start = int(rng.integers(w.shared_prefix_len, len(ids) - own))
    if rate is not None:
      clock += float(rng.exponential(1.0 / rate))
    out.append(Request(
        id=i, prompt=tuple(prefix + [int(t) for t in ids[start:start + own]]),
        max_new_tokens=output_len, ignore_eos=w.ignore_eos, arrival=clock))
  return out
