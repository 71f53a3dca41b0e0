r"""lm-evaluation-harness through a quantized KV cache (`--model kvq_jax`).

  pip install -e '.[lmeval]'      # lm-eval 0.4.x (no torch): not in CI
  python -m experiments.lm_eval --model kvq_jax \
      --model_args model=qwen2.5-coder-0.5b,config=int4_g32_asym \
      --tasks TASK [--include_path DIR] [--output_path DIR]

Registers the model (kvq_jax/tasks/lm_eval_model.py) and runs lm-eval's own
command line, whose flags these are (argparse, not absl); installed as the
`kvq-lm-eval` script too. The bare `lm_eval` script cannot find `kvq_jax`:
lm-eval 0.4 looks models up in its own table and in modules already
imported, with no plugin entry point. model_args:
model, config (a preset), baseline (true: its full-precision cache),
batch, max_length, max_gen_toks.
"""

import sys


def main() -> None:
  try:
    from kvq_jax.tasks import lm_eval_model  # noqa: F401 (registers)
    from lm_eval.__main__ import cli_evaluate
  except ImportError as e:
    sys.exit(f"experiments.lm_eval needs lm-eval: pip install -e "
             f"'.[lmeval]' ({e})")
  cli_evaluate()


if __name__ == "__main__":
  main()
