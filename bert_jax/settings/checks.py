"""What every check of a config value shares: one `error:` line naming
`--config.<field>` and what was expected, and the integer tests (a bool is not one).

Every section module of `bert_jax.settings` raises through these. No JAX.
"""

from __future__ import annotations

from typing import Any

from bert_jax.errors import ConfigError


def fail(field: str, value: Any, expected: str) -> ConfigError:
  return ConfigError(f"--config.{field}={value!r}: expected {expected}")


def is_int(v: Any) -> bool:
  return isinstance(v, int) and not isinstance(v, bool)


def positive_int(field: str, v: Any) -> None:
  if not is_int(v) or v <= 0:
    raise fail(field, v, "a positive integer")
