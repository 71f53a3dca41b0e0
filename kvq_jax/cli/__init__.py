"""What every script under experiments/ shares on its command line.

* `config_flag`: `--config=NAME|PATH` (locked, dotted overrides).
* `data_flags`: `--eval_data`, `--model`, comma-separated integer lists.
* `distributed_flags`: multi-process start-up flags.
* `log_setup`: `--log_level`; other libraries' INFO logs kept off.
* `entry`: `run_main(main)`, every script's `app.run`: bad input in one line.
* `progress`: the one-line progress bar.
"""
