"""Issue 55: every storage backend implements the one protocol (storage/backend.py) with
the same parameters, and checkpoints ask the backend of their path for TensorStore's
context, through the one module that touches Orbax's private names."""

import importlib
import inspect

import pytest

from bert_jax.io import orbax_private
from bert_jax.storage import backend, fs, local

MEMBERS = [name for name in vars(backend.Backend) if not name.startswith("_")]
REMOTE = [name for name in vars(backend.RemoteBackend) if not name.startswith("_")]


@pytest.mark.parametrize("name", sorted(fs.BACKENDS) + ["local"])
def test_each_backend_has_every_operation_of_the_protocol_with_its_parameters(name):
  impl = local.BACKEND if name == "local" else fs.BACKENDS[name]
  assert isinstance(impl.remote, bool)
  for member in [m for m in MEMBERS + (REMOTE if impl.remote else []) if m != "scheme"]:
    want = inspect.signature(getattr(backend.RemoteBackend, member))
    got = inspect.signature(getattr(type(impl), member))
    assert list(got.parameters) == list(want.parameters), (name, member)


def test_the_protocol_is_every_public_operation_of_the_backends():
  for impl in [local.BACKEND, *fs.BACKENDS.values()]:
    public = {n for n in vars(type(impl)) if not n.startswith("_")}
    want = set(MEMBERS) | {"remote"} | ({"scheme", *REMOTE} if impl.remote else set())
    assert public == want, type(impl).__name__


def test_only_a_bucket_path_has_a_tensorstore_context():
  assert fs.tensorstore_context("/tmp/x") == {}
  ctx = fs.tensorstore_context("gs://bkt/run/checkpoints")
  assert ctx["gcs_request_retries"]["max_retries"] > 0


@pytest.mark.parametrize("module, name", orbax_private.PRIVATE_NAMES)
def test_the_private_orbax_names_used_exist_in_the_installed_orbax(module, name):
  assert hasattr(importlib.import_module(module), name), (module, name)


def test_a_context_reaches_the_dicts_orbax_builds_its_tensorstore_contexts_from():
  from orbax.checkpoint._src.serialization import tensorstore_utils as ts_utils
  orbax_private.use_tensorstore_context(fs.tensorstore_context("gs://bkt/x"))
  for use_ocdbt in (False, True):
    got = ts_utils.get_ts_context(use_ocdbt=use_ocdbt).spec.to_json()["gcs_request_retries"]
    want = fs.tensorstore_context("gs://bkt/x")["gcs_request_retries"]
    assert got["max_retries"] == want["max_retries"] < 32, got  # TensorStore's own is 32
    assert got["max_delay"] == want["max_delay"], got
