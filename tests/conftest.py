"""Every test sees 8 simulated CPU devices (set before JAX is imported)."""

import os
import sys

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tempfile

import pytest


@pytest.fixture(autouse=True, scope="session")
def _session_tmpdir(tmp_path_factory):
  """Temporary files of the tests and of the processes they start go under pytest's own
  directory, which pytest prunes, not /tmp, which CI machines keep between runs: the
  coordinator-port lock files of every multi-process test piled up there."""
  path = tmp_path_factory.mktemp("tmpdir")
  # bert-jax's caches (compiled steps, bucket copies, prepared data) too: the session
  # shares them, the user's ~/.cache and other sessions do not.
  # Under xdist one folder for every worker of this run (pytest-<n>/, which pytest prunes).
  root = tmp_path_factory.getbasetemp()
  cache = (root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root) / "xdg-cache"
  cache.mkdir(exist_ok=True)
  values = {"TMPDIR": str(path), "XDG_CACHE_HOME": str(cache)}
  old = {k: os.environ.get(k) for k in values}
  os.environ.update(values)
  tempfile.tempdir = None  # gettempdir() caches its first answer
  yield
  for k, v in old.items():
    if v is None:
      os.environ.pop(k, None)
    else:
      os.environ[k] = v
  tempfile.tempdir = None


@pytest.fixture(autouse=True)
def _no_stop_request_left():
  """A signal a test sent to this process and no run carried out must not stop the next
  test's run at its first safe point (bert_jax.errors' stop request is process-wide)."""
  yield
  from bert_jax import errors  # pylint: disable=import-outside-toplevel
  errors.clear_stop()


@pytest.fixture(scope="module")
def module_compile_cache(tmp_path_factory):
  """A persistent XLA cache for one test module, shared with its train.py runs (compiling
  dominates a tiny run: `soak_kill.subprocess_env(cache)`), restored afterwards for the
  other modules. A module that wants it for every test lists it in `usefixtures`."""
  import soak_kill  # pylint: disable=import-outside-toplevel
  with soak_kill.in_process_compile_cache(str(tmp_path_factory.mktemp("xla_cache"))) as cache:
    yield cache


@pytest.fixture(scope="module")
def server(tmp_path_factory):
  """A real GCS server (fake-gcs-server, tests/gcs_server.py) with a bucket `bkt`, for one
  module: gs://bkt/... reaches it while the module runs."""
  from gcs_server import GcsServer  # pylint: disable=import-outside-toplevel
  with GcsServer(tmp_path_factory.mktemp("gcs"), buckets=("bkt",)) as s:
    yield s


@pytest.fixture
def tiny_config():
  """The tiny test config (tests/tiny_run.py) with any overrides, by dotted name:
  `tiny_config(**{"train.num_steps": 6, "log_every": 2})`."""
  import tiny_run  # pylint: disable=import-outside-toplevel
  return tiny_run.config


@pytest.fixture
def workdir(tmp_path) -> str:
  """A run's folder, not yet made (train.py makes it)."""
  return str(tmp_path / "run")


@pytest.fixture
def killed_run():
  """`killed_run(args, env, workdir, checkpoints)`: train.py with `args` (its output
  dropped), SIGKILLed at a random moment just after each of `checkpoints` is complete,
  each run resuming the one before; the tests' one kill loop
  (soak_kill.kill_after_checkpoints on soak_kill.kill_once). Returns (the newest
  checkpoint after each kill, the seed of the moments, for a failure's message)."""
  import random  # pylint: disable=import-outside-toplevel
  import subprocess  # pylint: disable=import-outside-toplevel
  import soak_kill  # pylint: disable=import-outside-toplevel

  def run(args: list, env: dict, workdir: str, checkpoints) -> tuple[list, int]:
    train = [sys.executable, os.path.join(soak_kill.ROOT, "train.py"), *args]
    start = lambda: subprocess.Popen(train, env=env, stdout=subprocess.DEVNULL,  # noqa: E731
                                     stderr=subprocess.DEVNULL)
    seed = random.randrange(2**31)
    newest = soak_kill.kill_after_checkpoints(start, workdir, checkpoints,
                                              random.Random(seed), f"seed {seed}: ")
    return newest, seed
  return run
