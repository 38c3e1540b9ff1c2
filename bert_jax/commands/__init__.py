"""The commands: each a thin layer of flags and messages over the library.

  train      train.py, bert-jax-train           pre-training (bert_jax.trainer)
  features   python -m bert_jax.features        features of a checkpoint (features/)
  probe      python -m bert_jax.probe           a linear probe of a checkpoint (eval/)
  finetune   python -m bert_jax.finetune        fine-tuning a checkpoint (eval/)
  convert    python -m bert_jax.convert         HuggingFace/TF checkpoints in and out (io/)
  plan       python -m bert_jax.plan            a run's memory and time on a TPU (planner/)
  common     what they share: `Parser`, one `error:` line and exit 2 on bad input,
             help on a pipe
  config_args  train's and plan's `--config NAME|FILE` and `--config.FIELD=VALUE`
  launch     how each starts (the host allocator first), for the console scripts and
             the `python -m` names

A new command is a module here with a `cli()`, a line in `launch`, a console script in
pyproject.toml and, for `python -m bert_jax.<name>`, a two-line module of that name
(`bert_jax/<name>.py`, or `bert_jax/<name>/__main__.py` where the name is also a folder,
as `features`), each handing over to `launch.<name>()`.
Commands sit above every folder: nothing in the library imports them. Every command
parses its flags with `common.Parser`; one that runs from a config adds
`config_args.add_config` and reads it with `config_args.parse_known`.
"""
