"""`python -m bert_jax.finetune`: the command's name; its code is bert_jax.commands.finetune."""

if __name__ == "__main__":
  from bert_jax.commands import launch
  launch.finetune()
