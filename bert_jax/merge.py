"""`python -m bert_jax.merge`: the command's name; its code is bert_jax.commands.merge."""

if __name__ == "__main__":
  from bert_jax.commands import launch
  launch.merge()
