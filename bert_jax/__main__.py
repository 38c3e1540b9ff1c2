"""`python -m bert_jax <command> [arguments]`: every command by its name
(bert_jax.commands.launch.main; `python -m bert_jax` lists them)."""

if __name__ == "__main__":
  from bert_jax.commands import launch
  launch.main()
