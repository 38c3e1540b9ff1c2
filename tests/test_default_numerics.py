"""Issue 55: refactors keep the default models' numbers (BERT's default, and ModernBERT).

tests/golden/default_numerics.json was written by tests/default_numerics.py at c73dfde,
before architecture round 5; the same script after it printed the same file bit for bit
on that machine (the check to repeat across a refactor: run the script at both commits).
Here the numbers are compared to float32 rounding, since another CPU's XLA may round
its vectorised sums differently in the last bit.
"""

import json
import os

import numpy as np
import pytest

import default_numerics

pytestmark = pytest.mark.slow  # trains: the full suite, not the fast tier

GOLDEN = os.path.join(os.path.dirname(__file__), "golden", "default_numerics.json")


@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_three_steps_and_an_evaluation_give_the_numbers_of_before_the_refactor(family):
  with open(GOLDEN, encoding="utf-8") as f:
    want = json.load(f)[family]
  got = default_numerics.numbers(family)
  assert set(got) == set(want)
  for name, value in want.items():
    as_float = lambda v: np.array([float.fromhex(x) for x in np.atleast_1d(v)])
    np.testing.assert_allclose(as_float(got[name]), as_float(value), rtol=2e-6, err_msg=name)
