"""`python -m bert_jax.convert`: the command's name; its code is bert_jax.commands.convert."""

if __name__ == "__main__":
  from bert_jax.commands import launch
  launch.convert()
