"""`python -m bert_jax.plan`: the command's name; its code is bert_jax.commands.plan."""

if __name__ == "__main__":
  from bert_jax.commands import launch
  launch.plan()
