"""What the engine is asked to serve, and what it reports per request."""

from __future__ import annotations

import dataclasses
from typing import Sequence


@dataclasses.dataclass(frozen=True)
class Request:
  """One generation request.

  Attributes:
    id: any hashable name, reported back.
    prompt: token ids (>= 1).
    max_new_tokens: at most this many tokens are generated (>= 1).
    temperature: 0 for argmax, > 0 to sample from softmax(logits / T);
      token i is drawn with fold_in(key(seed), i), as `models.generate`.
    seed: the request's PRNG seed.
    eos_id: stop after emitting it; None uses the model's eos token.
    ignore_eos: never stop at EOS (fixed output lengths for benchmarks).
    stop: stop after the text of the new tokens contains any of these
      (needs the engine's tokenizer).
    arrival: seconds after the run starts at which the request arrives.
  """

  id: object
  prompt: tuple[int, ...]
  max_new_tokens: int
  temperature: float = 0.0
  seed: int = 0
  eos_id: int | None = None
  ignore_eos: bool = False
  stop: tuple[str, ...] = ()
  arrival: float = 0.0

  def __post_init__(self):
    object.__setattr__(self, "prompt", tuple(int(t) for t in self.prompt))
    object.__setattr__(self, "stop", tuple(self.stop))
    if not self.prompt:
      raise ValueError(f"Request {self.id!r}: the prompt is empty; need >= 1 "
                       "token.")
    if isinstance(self.max_new_tokens, bool) or not isinstance(
        self.max_new_tokens, int) or self.max_new_tokens < 1:
      raise ValueError(f"Request {self.id!r}: max_new_tokens="
                       f"{self.max_new_tokens!r}; allowed: an int >= 1.")
    if self.temperature < 0:
      raise ValueError(f"Request {self.id!r}: temperature="
                       f"{self.temperature!r}; allowed: >= 0.")
    if self.arrival < 0:
      raise ValueError(f"Request {self.id!r}: arrival={self.arrival!r}; "
                       "allowed: >= 0 seconds.")

  @property
  def max_tokens(self) -> int:
    """Prompt + new tokens: the most the request's cache ever holds."""
    return len(self.prompt) + self.max_new_tokens


@dataclasses.dataclass
class RequestResult:
  """A served request: its tokens, why it stopped, and when things
  happened (seconds since the run started)."""

  id: object
  prompt: tuple[int, ...]
  new_ids: list[int] = dataclasses.field(default_factory=list)
  finish_reason: str | None = None  # 'eos', 'stop' or 'length'.
  arrival: float = 0.0
  admitted: float | None = None
  token_times: list[float] = dataclasses.field(default_factory=list)
  preemptions: int = 0
  reused_tokens: int = 0  # Prompt tokens served from the prefix cache.

  @property
  def ttft(self) -> float:
    """Time to the first token, from arrival."""
    return self.token_times[0] - self.arrival

  @property
  def inter_token(self) -> list[float]:
    """Gaps between consecutive tokens."""
    t = self.token_times
    return [b - a for a, b in zip(t, t[1:])]

  @property
  def finished(self) -> float:
    return self.token_times[-1]


def check_requests(requests: Sequence[Request]) -> None:
  """ValueError for duplicate ids or something that is not a Request."""
  seen = set()
  for r in requests:
    if not isinstance(r, Request):
      raise ValueError(f"Engine: {r!r} is not a serving.Request.")
    if r.id in seen:
      raise ValueError(f"Engine: request id {r.id!r} appears twice.")
    seen.add(r.id)
