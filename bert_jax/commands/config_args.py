"""The config arguments of train and plan: `--config NAME|FILE` and `--config.FIELD=VALUE`.

Every command parses its flags with `common.Parser` (argparse). The commands that
run from a config (train, plan) add `--config` to it here; what argparse leaves over
(`--config.FIELD=VALUE` or `--config.FIELD VALUE`) goes to ml_collections, which
loads the file and types each override by the field it replaces, in a flag set of
its own (not absl's global one, so the commands' flags live in one parser). Every
failure is a ConfigError naming the flag and what was expected: one `error:` line.
"""

from __future__ import annotations

import argparse
import os
import re

from bert_jax.errors import ConfigError
from bert_jax.storage import fs

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # bert_jax/
CONFIG_NAMES = ("tiny", "base", "large", "default")
_KINDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string",
          tuple: "a tuple such as '(128,512)'", list: "a tuple such as '(128,512)'"}


def configs_dir() -> str:
  """The shipped configs: the repo's configs/ in a checkout, bert_jax/configs installed."""
  repo = os.path.join(os.path.dirname(PACKAGE_DIR), "configs")
  return repo if os.path.isfile(os.path.join(repo, "tiny.py")) else os.path.join(PACKAGE_DIR,
                                                                                 "configs")


def config_path(name: str) -> str:
  """`tiny` (a shipped config's name, not a file here) -> its file; a path stays a path."""
  if name in CONFIG_NAMES and not os.path.exists(name):
    return os.path.join(configs_dir(), f"{name}.py")
  return name


def add_config(parser: argparse.ArgumentParser, default_config: str) -> None:
  """Adds --config to a command's parser (its overrides are read by parse_known)."""
  parser.add_argument(
      "--config", default=default_config, metavar="NAME_OR_FILE",
      help=f"a config file (ml_collections), or one the package ships: "
      f"{', '.join(CONFIG_NAMES)}; change a field with --config.FIELD=VALUE")


def parse_known(parser: argparse.ArgumentParser, argv: list[str]):
  """(args, config): the command's flags, and its config with the overrides applied;
  `args.explicit`: the fields the overrides set (`explicit_fields`)."""
  args, rest = parser.parse_known_args(argv)
  args.config = config_path(args.config)
  args.explicit = explicit_fields(rest)
  return args, load_config(args.config, rest)


def explicit_fields(overrides: list[str]) -> frozenset[str]:
  """The dotted fields (`model.local_attention`) that `--config.FIELD` flags set, whatever
  their values: a setting the user asked for, even at its default's value."""
  return frozenset(a[len("--config."):].split("=", 1)[0] for a in overrides
                   if a.startswith("--config."))


def load_config(path: str, overrides: list[str]):
  """The locked ConfigDict of `path` with `--config.FIELD=VALUE` `overrides` applied."""
  from absl import flags  # pylint: disable=import-outside-toplevel
  from ml_collections import config_flags  # pylint: disable=import-outside-toplevel
  argv = ["bert-jax", f"--config={path}", *_last_of_each(overrides)]
  values = flags.FlagValues()
  try:
    # ml_collections reads the overrides when the flag is defined: from `argv`.
    config_flags.DEFINE_config_file("config", path, flag_values=values, lock_config=True,
                                    sys_argv=argv)
    left = values(argv)[1:]
    config = values.config
    config.keys()  # a file that failed to load raises only when used
  except (flags.Error, AttributeError, KeyError, OSError) as e:
    raise ConfigError(_error_text(e, overrides, values)) from None
  if left:
    raise ConfigError(f"unrecognized arguments: {' '.join(left)}; expected the flags that "
                      "--help lists, and --config.FIELD=VALUE")
  return config


def _last_of_each(overrides: list[str]) -> list[str]:
  """`overrides` with only the last setting of each field: a later flag replaces an
  earlier one, for tuples as for scalars (absl's parser appends a tuple flag given twice:
  `(64,)` then `(32,)` became `(64, 32)`)."""
  groups, i = [], 0
  while i < len(overrides):
    arg = overrides[i]
    takes_next = (arg.startswith("--config.") and "=" not in arg and i + 1 < len(overrides)
                  and not overrides[i + 1].startswith("--"))
    groups.append(overrides[i:i + 1 + takes_next])
    i += 1 + takes_next
  name = lambda g: g[0].split("=", 1)[0] if g[0].startswith("--config.") else None
  last = {name(g): k for k, g in enumerate(groups)}
  return [a for k, g in enumerate(groups) if name(g) is None or last[name(g)] == k for a in g]


def _error_text(e: BaseException, overrides: list[str], values) -> str:
  """One line for a failure of ml_collections or absl, naming the flag."""
  from absl import flags  # pylint: disable=import-outside-toplevel
  while e.args and isinstance(e.args[0], BaseException):
    e = e.args[0]  # ml_collections wraps the KeyError of an unknown field
  text = " ".join(str(e.args[0] if e.args else e).split())
  if isinstance(e, (AttributeError, KeyError)):  # an override of a field that does not exist
    key = (re.findall(r"'([^']+)'", text) or [text])[0]
    names = [a.split("=", 1)[0] for a in overrides
             if a.startswith("--config.") and key in a.split("=", 1)[0].split(".")]
    hint = re.search(r'Did you mean "([^"]+)"', text)
    return (f"{names[0] if names else '--config'}: the config has no field '{key}'; expected "
            + (f"'{hint.group(1)}' or another" if hint else "a") + " field of the config file")
  if isinstance(e, flags.IllegalFlagValueError) and text.startswith("flag --"):
    name, _, rest = text[len("flag --"):].partition(": ")
    field = name.split("=", 1)[0]
    kind = _KINDS.get(type(values[field].value)) if field in values else None
    return f"--{name}: " + (f"expected {kind} ({rest})" if kind else rest)
  if isinstance(e, flags.UnrecognizedFlagError):
    return text + "; expected the flags that --help lists, and --config.FIELD=VALUE"
  if isinstance(e, OSError):  # a --config file that cannot be loaded
    why = re.search(r"\[Errno \d+\] (.*)", text)
    return (f"--config: {why.group(1) if why else text}; expected a config file, or one "
            f"of {', '.join(CONFIG_NAMES)}")
  return text


def config_meanings() -> dict[str, str]:
  """`data.corpus` -> its one-line meaning: the comment on (or above) its line in default_config.py."""
  path = os.path.join(PACKAGE_DIR, "default_config.py")
  meanings, above, section = {}, [], ""
  with fs.open(path, encoding="utf-8") as f:
    for line in f:
      text = line.strip()
      if text.startswith("#"):
        above = [] if text.startswith("# ---") else above + [text.lstrip("# ")]
        continue
      # Each section is its own function: `def _data()` holds the fields of `data.`.
      if (fn := re.match(r"def (_?)(\w+)\(", text)) is not None:
        section = fn.group(2) + "." if fn.group(1) else ""
      field = re.match(r"c\.([\w.]+)\s*=(.*)$", text)
      value = field.group(2).strip() if field else ""
      if field and not value.startswith("ml_collections.ConfigDict") and not re.match(
          r"_\w+\(\)", value):
        trailing = re.search(r"\s#\s*(.*)$", field.group(2))
        meanings[section + field.group(1)] = trailing.group(1) if trailing else " ".join(above)
      above = []
  return meanings


def config_fields(config, prefix: str = "") -> list[tuple[str, object]]:
  """(dotted field, value) of every leaf of `config`."""
  out = []
  for key, value in config.items():
    if hasattr(value, "items"):
      out += config_fields(value, f"{prefix}{key}.")
    else:
      out.append((f"{prefix}{key}", value))
  return out


def fields_help(config, path: str) -> str:
  """--help's listing: every --config.* field with its value (overrides applied) and meaning."""
  meanings, fields = config_meanings(), config_fields(config)
  width = max(len(f"--config.{k}={v!r}") for k, v in fields)
  lines = [f"config fields (defaults from {path} with the overrides given; change one with "
           "--config.FIELD=VALUE):"]
  for key, value in fields:
    shown = f"'{value}'" if isinstance(value, str) else str(value).replace(" ", "")
    lines.append(f"  {f'--config.{key}={shown}':<{width}}  {meanings.get(key, '')}".rstrip())
  return "\n".join(lines)
