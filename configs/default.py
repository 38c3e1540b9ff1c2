"""The default config (BERT-Base, the reference recipe): `bert_jax.default_config`.

It lives in the package so an installed bert-jax has it; the other configs
here derive from it and change only what differs.
"""

from bert_jax.default_config import get_config  # noqa: F401
