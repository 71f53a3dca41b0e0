r"""The preset catalogue: every configs/ preset with its role, family, model,
effective bits and headline ΔPPL; writes configs/README.md.

  python -m experiments.presets [--out=configs/README.md]

Effective bits are priced on the model each preset was made for (its
shapes read from the checkpoint, fetched once like any run's). Details:
kvq_jax/report/preset_catalogue.py.
"""

from absl import flags

from kvq_jax import facade
from kvq_jax.cli import log_setup
from kvq_jax.cli.entry import run_main
from kvq_jax.report import preset_catalogue
from kvq_jax.settings.presets import CONFIG_DIR

_OUT = flags.DEFINE_string("out", str(CONFIG_DIR / "README.md"),
                           "where the catalogue is written")


def main(argv):
  del argv
  log_setup.configure_from_flags()
  configs = {}

  def model_config(name):
    if name not in configs:
      configs[name] = facade.model_config(name)
    return configs[name]

  rows = preset_catalogue.catalogue(model_config)
  text = preset_catalogue.markdown(rows, "python -m experiments.presets")
  with open(_OUT.value, "w", encoding="utf-8") as f:
    f.write(text)
  print(text)
  print(f"wrote {_OUT.value}")


if __name__ == "__main__":
  run_main(main)
