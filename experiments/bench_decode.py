r"""One decode step of a registered model's shapes vs context and cache kind.

  python -m experiments.bench_decode --max_context=32768 --repeats=3
  python -m experiments.bench_decode --model=gemma3-270m --max_context=8192
  python -m experiments.bench_decode --kinds=bf16,float32,int8,tq4 \
      --contexts=1024,16384 --batch=1,8 --json=runs/bench/decode.json
  python -m experiments.bench_decode --kinds=bf16,int8,q4_0 \
      --contexts=16384 --rounds=3   # interleaved rounds, per-round ratios

Kinds: bf16 / float32 (dense) or any preset name (its cache spec and dtype).
Prints time per step (median), XLA temporaries of the compiled step, the
cache bytes (every cache leaf) and effective bits, with ratios to the
fastest full-precision cache at the same context and batch; every kind at
one context gets the same number of slots. --rounds=R > 1 times the kinds
of a context in turn R times (all held at once: memory for every kind's
cache) and adds the range of the per-round ratios, each round against
its own fastest full-precision step. --json writes the rows (with
round_seconds, each round's median).
The weights are random float32 of the model's real shapes (`--model`, a
registered name or a checkpoint path, read for its metadata only; timing and
memory do not depend on the values); the cache contents are zeros. Sliding-
window layers (Gemma 3) get their ring caches, so their bytes stop growing
past the window.

--generate benchmarks whole greedy generations instead (`generate_bench`):

  python -m experiments.bench_decode --generate \
      --contexts=1024,4096,16384,32768 --kinds=bf16,int8,q4_0,kvq4 \
      --new_tokens=128 --batch=1 --json=runs/bench/generate.json

Per kind and context: a random prompt of `context` token ids (the same for
every kind) is prefilled into the kind's cache in one jitted call, then
--new_tokens greedy jitted decode steps run through the same cache (slots =
context + new_tokens, equal for every kind at one context). Prints the
prefill seconds, decode tokens/s (decode steps only, the first of them an
untimed warm-up; both programs are compiled ahead of time, so no compile is
timed; needs --new_tokens >= 2) with its ratio to the
fastest full-precision kind, the XLA memory of the compiled decode step and
prefill (arguments + outputs - donated + temporaries, weights included), the
process's peak RSS over that kind's run, the cache bytes (every leaf, with
the ratio) and effective bits. --json rows: every `generate_bench.Row` field
(kind, context, batch, new_tokens, slots, prefill_seconds, decode_seconds,
decode_tokens_per_s, decode_step_bytes, prefill_bytes, peak_rss_gib,
cache_bytes, effective_bits, token_ids: the prefill's greedy pick and one
per decode step) plus baseline, tokens_per_s_ratio
and cache_bytes_ratio. --repeats is not used there; --max_context is.
"""

from __future__ import annotations

from absl import flags

from kvq_jax import assets
from kvq_jax.bench import decode_bench
from kvq_jax.bench import generate_bench
from kvq_jax.bench.kinds import DEFAULT_KINDS
from kvq_jax.bench.timing import machine_description
from kvq_jax.calibration import auto_key_stats
from kvq_jax.cli import log_setup
from kvq_jax.cli.data_flags import int_list
from kvq_jax.cli.entry import run_main
from kvq_jax.facade import model_config
from kvq_jax.models.params import decoder_from_params, random_params
from kvq_jax.models.runtime import Runtime

_MAX_CONTEXT = flags.DEFINE_integer(
    "max_context", 32768, "Contexts are 1024, 2048, ... doubling up to it.")
_CONTEXTS = flags.DEFINE_list("contexts", [],
                              "Explicit contexts (instead of --max_context).")
_KINDS = flags.DEFINE_list("kinds", list(DEFAULT_KINDS),
                           "Cache kinds: bf16, float32, preset names or "
                           "short specs.")
_BATCH = flags.DEFINE_list("batch", ["1"], "Sequences per step (a list).")
_JSON = flags.DEFINE_string("json", None, "Also write the rows to this file.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed steps (median).")
_ROUNDS = flags.DEFINE_integer(
    "rounds", 1, "Timing rounds: with R > 1 all kinds of a context are "
    "compiled and held at once, then timed in turn R times; the table adds "
    "the range of the per-round ratios (`decode_bench`).")
_GENERATE = flags.DEFINE_bool(
    "generate", False,
    "Benchmark prefill + --new_tokens greedy decode steps per kind/context "
    "(generate_bench) instead of one decode step.")
_NEW_TOKENS = flags.DEFINE_integer(
    "new_tokens", 128, "--generate: greedy decode steps after the prompt.")
_MODEL = flags.DEFINE_string("model", assets.DEFAULT_MODEL,
                             "registered name or checkpoint path (shapes)")


def main(argv):
  log_setup.configure_from_flags()
  del argv
  # Presets with key-stats recipes calibrate on the real model's weights
  # (cached; the speed of a step does not depend on their values).
  with auto_key_stats.run_context(_MODEL.value, None):
    _main()


def _main():
  contexts = decode_bench.bench_contexts(int_list(_CONTEXTS),
                                         _MAX_CONTEXT.value)
  batches = int_list(_BATCH)
  config = model_config(_MODEL.value)
  runtime = Runtime(decoder_from_params(config, random_params(config)))
  print(machine_description())
  local = (f", {len(config.local_layers)} sliding-window layers of "
           f"{config.sliding_window}" if config.local_layers else "")
  print(f"model: random float32 weights of the {_MODEL.value} shapes "
        f"({config.name}, L={config.num_layers}, K={config.num_kv_heads}, "
        f"N={config.num_heads}, H={config.head_dim}{local}); "
        f"B={batches}; contexts {contexts}")
  if _GENERATE.value:
    _generate(runtime, contexts, batches)
    return
  print(f"median of {_REPEATS.value} steps"
        + (f", {_ROUNDS.value} interleaved rounds (median of the round "
           "medians)" if _ROUNDS.value > 1 else ""))
  rows = []
  for batch in batches:
    rows += decode_bench.run(runtime, _KINDS.value, contexts,
                             batch_size=batch, repeats=_REPEATS.value,
                             rounds=_ROUNDS.value)
  print(decode_bench.format_table(rows))
  if _JSON.value:
    print(f"rows: {decode_bench.write_rows(_JSON.value, _MODEL.value, rows)}")


def _generate(runtime: Runtime, contexts: list[int], batches: tuple[int, ...]
              ) -> None:
  print(f"--generate: prefill + {_NEW_TOKENS.value} greedy decode steps")
  rows = []
  for batch in batches:
    rows += generate_bench.run(runtime, _KINDS.value, contexts,
                               batch_size=batch, new_tokens=_NEW_TOKENS.value)
  print(generate_bench.format_table(rows))
  if _JSON.value:
    path = decode_bench.write_rows(_JSON.value, _MODEL.value, rows,
                                   generate_bench.rows_json)
    print(f"rows: {path}")


if __name__ == "__main__":
  run_main(main)
