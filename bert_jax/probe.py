"""`python -m bert_jax.probe`: the command's name; its code is bert_jax.commands.probe."""

if __name__ == "__main__":
  from bert_jax.commands import launch
  launch.probe()
