"""`experiments.serve_bench`'s body: flags in, the benchmark run, files out.

Everything that can be refused (unknown kinds, a negative rate, a budget
below one request's pages, a prompt longer than the model's context, a page
size the spec cannot use) is checked before any program compiles.
"""

from __future__ import annotations

from typing import Sequence

from kvq_jax.bench.timing import machine_description
from kvq_jax.cache.paged.layer import page_size_reason
from kvq_jax.cache.paged.model import paged_layer_spec
from kvq_jax.eval.corpus import load_eval_text
from kvq_jax.eval.windows import text_ids
from kvq_jax.facade import load_model
from kvq_jax.models.runtime import Runtime
from kvq_jax.serving import bench, bench_report
from kvq_jax.serving.workload import Workload, make_requests
from kvq_jax.settings.kinds import resolve_kind


def _budget(runtime: Runtime, kinds, request_tokens: int, page_size: int, *,
            kv_budget_mib, device_memory_gib, budget_requests) -> int:
  given = [x is not None for x in (kv_budget_mib, device_memory_gib,
                                   budget_requests)]
  if sum(given) != 1:
    raise ValueError("give exactly one of --kv_budget_mib, "
                     "--device_memory_gib, --budget_requests.")
  if kv_budget_mib is not None:
    if kv_budget_mib <= 0:
      raise ValueError(f"--kv_budget_mib={kv_budget_mib}: allowed: > 0.")
    return int(kv_budget_mib * 2 ** 20)
  if device_memory_gib is not None:
    weights = bench.weight_bytes(runtime)
    left = int(device_memory_gib * 2 ** 30) - weights
    if left <= 0:
      raise ValueError(f"--device_memory_gib={device_memory_gib}: the "
                       f"weights alone take {weights / 2 ** 30:.3f} GiB.")
    return left
  if budget_requests < 1:
    raise ValueError(f"--budget_requests={budget_requests}: allowed: >= 1.")
  return bench.budget_for_requests(runtime, kinds[0], request_tokens,
                                   budget_requests, page_size)


def check_kinds(config, kinds: Sequence[str], page_size: int) -> None:
  """ValueError for an unknown kind or one whose layers P cannot page."""
  if not kinds:
    raise ValueError("--kinds is empty.")
  for kind in kinds:
    spec = resolve_kind(kind).spec
    for i in range(config.num_layers):
      if config.layer_window(i) is not None:
        continue
      why = page_size_reason(paged_layer_spec(spec, i), page_size)
      if why:
        raise ValueError(f"kind {kind!r}, layer {i}: {why}.")


def main(*, model: str, kinds: Sequence[str], kv_budget_mib, device_memory_gib,
         budget_requests, num_requests: int, prompt_len: int, output_len: int,
         lengths: str, arrival: str, max_slots: int, shared_prefix_len: int,
         prefix_caching: bool, page_size: int, prefill_chunk: int, seed: int,
         stop_at_eos: bool, eval_data: str | None, out: str) -> list[dict]:
  workload = Workload(num_requests, prompt_len, output_len, lengths, arrival,
                      shared_prefix_len, seed, ignore_eos=not stop_at_eos)
  if max_slots < 1:
    raise ValueError(f"--max_slots={max_slots}: allowed: >= 1.")
  loaded = load_model(model)
  config = loaded.decoder.config
  config.check_context(workload.max_tokens,
                       "the longest request (--prompt_len + --output_len)")
  check_kinds(config, kinds, page_size)
  runtime = Runtime(loaded.decoder)
  text, source = load_eval_text(eval_data)
  ids, _ = text_ids(loaded.tokenizer, text)
  requests = make_requests(workload, ids)
  request_tokens = max(r.max_tokens for r in requests)
  budget = _budget(runtime, kinds, request_tokens, page_size,
                   kv_budget_mib=kv_budget_mib,
                   device_memory_gib=device_memory_gib,
                   budget_requests=budget_requests)
  print(machine_description())
  print(f"model {model}; {workload.label()}; prompts from {source}; KV "
        f"budget {budget / 2 ** 20:.2f} MiB; page {page_size}; prefill "
        f"chunk {prefill_chunk}; max slots {max_slots}", flush=True)
  header = {"model": model, "workload": workload.label(), "prompts": source,
            "budget_bytes": budget, "page_size": page_size,
            "prefill_chunk": prefill_chunk, "max_slots": max_slots,
            "prefix_caching": prefix_caching,
            "weight_bytes": bench.weight_bytes(runtime)}
  # The kinds finished so far are written after each one (a long run
  # interrupted keeps them); the last write holds every kind.
  rows = bench.run(runtime, kinds, requests, budget, max_slots=max_slots,
                   page_size=page_size, prefill_chunk=prefill_chunk,
                   prefix_caching=prefix_caching,
                   on_kind=lambda done: bench_report.write(out, done, header))
  print(bench_report.markdown_table(rows))
  print(bench_report.chain(rows))
  print(bench_report.profile(rows))
  for path in bench_report.write(out, rows, header):
    print(f"wrote {path}")
  return rows
