"""The `--eval_data` and `--model` flags every experiment script shares (or
`--model` alone), and the parsing of comma-separated integer lists.

`--eval_data` is checked as the flags are parsed (`eval.corpus.read_eval_file`:
the file exists, is not empty, is UTF-8 text), so a bad file fails in one line
before any model is fetched, converted or loaded.
"""

from __future__ import annotations

from absl import app
from absl import flags

from kvq_jax.eval.corpus import read_eval_file


def DEFINE_data_flags() -> tuple[flags.FlagHolder, flags.FlagHolder]:  # pylint: disable=invalid-name
  """Defines --eval_data and --model; returns their holders (in that order).

  Both default to None: the standard-library text (WORKSPACE.md) and the
  preset's `config.model`.
  """
  return DEFINE_eval_data_flag(), DEFINE_model_flag()


def DEFINE_eval_data_flag(  # pylint: disable=invalid-name
    help_text: str = "UTF-8 text file; default: stdlib sources (WORKSPACE.md)",
    flag_values: flags.FlagValues = flags.FLAGS) -> flags.FlagHolder:
  """Defines --eval_data alone (default None), validated when parsed: a
  missing, empty or binary file is a flag error naming it (module
  docstring)."""
  holder = flags.DEFINE_string("eval_data", None, help_text,
                               flag_values=flag_values)
  flags.register_validator(holder, _check_eval_data,
                           flag_values=flag_values)
  return holder


def _check_eval_data(value: str | None) -> bool:
  """absl validator: a given file must be readable text (None: default)."""
  if value:
    try:
      read_eval_file(value)
    except ValueError as e:
      raise flags.ValidationError(str(e)) from e
  return True


def DEFINE_model_flag() -> flags.FlagHolder:  # pylint: disable=invalid-name
  """Defines --model alone (scripts that read no evaluation text); default
  None: the preset's `config.model`."""
  return flags.DEFINE_string("model", None,
                             "model name or path; default: config.model")


def int_list(holder: flags.FlagHolder) -> tuple[int, ...]:
  """A DEFINE_list flag's values as ints; app.UsageError naming the flag."""
  try:
    return tuple(int(v) for v in holder.value)
  except ValueError as e:
    raise app.UsageError(
        f"--{holder.name}={','.join(holder.value)}: integers only.") from e
