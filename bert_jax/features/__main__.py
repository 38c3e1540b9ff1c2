"""`python -m bert_jax.features`: the command's name; its code is bert_jax.commands.features.
(The one `python -m` pattern: a module of the command's name that hands over to `launch`;
`features` is also a folder of the library, so its module is the folder's __main__.)"""

if __name__ == "__main__":
  from bert_jax.commands import launch
  launch.features()
