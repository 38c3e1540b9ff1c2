"""Scale-out: two jax.distributed processes, and resumes across device counts.

Every run is a `python train.py` subprocess (a process has one device count and
one distributed setup for life). The two-process runs use the loopback address
and 4 simulated CPU devices each, and write one gs:// workdir (a real GCS server,
tests/gcs_server.py; a local folder where its wheel is not installed), as TPU pods
do; the reference is one process with 8, on a local disk.

All runs share one schedule: with warmup longer than the run, the learning rate
is lr * step / warmup whatever `num_steps` is, so a run stopped at step 12 by
`--config.train.num_steps=12` and continued with `=24` follows the same
schedule as one run of 24 steps.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from gcs_server import binary as gcs_server_binary
import multiprocess_runs as multiprocess
import soak_kill

pytestmark = pytest.mark.slow  # trains or starts processes: the full suite, not the fast tier

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(ROOT, "train.py")
TIMEOUT_S = 240  # per launch; a hung collective must fail the test, not the CI job
STEPS, HALF = 24, 12

TINY = [
    "--config.data.corpus=" + os.path.join(ROOT, "data", "corpus.txt"),
    "--config.data.dupe_factor=2", "--config.data.vocab_size=512",
    "--config.model.hidden_size=32", "--config.model.num_layers=1",
    "--config.model.num_heads=2", "--config.model.intermediate_size=64",
    "--config.model.max_position_embeddings=32",
    "--config.train.seq_lens=(32,)", "--config.train.max_predictions=(5,)",
    "--config.train.batch_size=16", "--config.train.learning_rate=0.1",
    "--config.train.warmup_steps=1000",
    "--config.log_every=1", f"--config.checkpoint_every={HALF}",
    "--config.eval_every=1000", "--config.eval_batches=1", "--config.progress_bar=False",
    "--config.probe.tasks=()",  # the runs of `runs` below set their own
    "--config.plot=False",  # matplotlib: 2.5 s of every run
]


def _free_port() -> int:
  return multiprocess.free_port()  # and the port after it (the start-up roster's)


def _env(devices: int, cache: str) -> dict:
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3",
         "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
         # Only for --config.compile_cache_dir= (off): otherwise train.py's own folder
         # ($XDG_CACHE_HOME/bert_jax/xla: conftest's folder for the test run) wins,
         # which every test's tiny runs share. Process 1 of a two-process run compiles
         # anyway: JAX writes the cache from process 0 only, and on CPU the processes'
         # cache keys differ.
         "JAX_COMPILATION_CACHE_DIR": cache,
         "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
         "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}
  return env


def _launch(launches: dict[str, tuple[list[str], int]], logs: str, cache: str,
            stop_on_failure: bool = True) -> dict[str, tuple[int, str, str]]:
  """Starts every launch {name: (train.py args, devices)} at once and waits for all.

  Returns {name: (exit code, stdout, stderr)}. The timeout, or with
  `stop_on_failure` any failure, kills all of them (a process left alone would
  wait for its peer in a collective); the timeout fails the test with each
  one's stderr tail.
  """
  os.makedirs(logs, exist_ok=True)
  procs = {}
  for name, (args, devices) in launches.items():
    out, err = os.path.join(logs, f"{name}.out"), os.path.join(logs, f"{name}.err")
    with open(out, "w") as o, open(err, "w") as e:
      procs[name] = (subprocess.Popen([sys.executable, TRAIN, *TINY, *args], cwd=ROOT, stdout=o,
                                      stderr=e, env=_env(devices, cache),
                                      start_new_session=True), out, err)
  deadline, timed_out = time.monotonic() + TIMEOUT_S, False
  while any(p.poll() is None for p, _, _ in procs.values()):
    if stop_on_failure and any(p.poll() not in (None, 0) for p, _, _ in procs.values()):
      break
    if time.monotonic() > deadline:
      timed_out = True
      break
    time.sleep(0.2)
  for p, _, _ in procs.values():
    if p.poll() is None:
      os.killpg(p.pid, signal.SIGKILL)
      p.wait()
  results = {}
  for name, (p, out, err) in procs.items():
    with open(out, errors="replace") as o, open(err, errors="replace") as e:
      results[name] = (p.returncode, o.read(), e.read())
  if timed_out:
    pytest.fail(f"timed out after {TIMEOUT_S} s:\n" + _report(results), pytrace=False)
  return results


def _report(results: dict[str, tuple[int, str, str]]) -> str:
  tails = {name: "\n".join(multiprocess.own_lines(err)[-15:])
           for name, (_, _, err) in results.items()}
  return "\n".join(f"--- {name} (exit {results[name][0]}) stderr tail:\n{tail}"
                   for name, tail in tails.items())


def _run(launches: dict[str, tuple[list[str], int]], logs: str, cache: str) -> dict[str, str]:
  """Like `_launch`, but every process must succeed; returns their stdouts."""
  results = _launch(launches, logs, cache)
  if any(code != 0 for code, _, _ in results.values()):
    pytest.fail("a process failed:\n" + _report(results), pytrace=False)
  return {name: out for name, (_, out, _) in results.items()}


def _one_process(workdir: str, steps: int, devices: int, data: str) -> tuple[list[str], int]:
  return [f"--workdir={workdir}", f"--config.train.num_steps={steps}",
          f"--config.data.cache_dir={data}"], devices


def _two_processes(workdir: str, steps: int, data: tuple[str, str]) -> dict:
  address = f"127.0.0.1:{_free_port()}"
  return {f"process{i}": ([f"--workdir={workdir}", f"--config.train.num_steps={steps}",
                           f"--config.data.cache_dir={data[i]}",
                           f"--coordinator_address={address}", "--num_processes=2",
                           f"--process_id={i}"], 4) for i in range(2)}


def _write_task(directory: str) -> str:
  """A plain task: label 'yes' when the text contains 'the' (3 times), from the corpus's words.
  Random features read it well above chance, so features gathered wrongly across processes
  would change its accuracy (the shipped `word_order` is near chance on a model this small)."""
  with open(os.path.join(ROOT, "data", "corpus.txt"), encoding="utf-8") as f:
    words = sorted({w for line in f for w in line.split()} - {"the"})
  rs = np.random.RandomState(0)
  os.makedirs(directory)
  for split, n in (("train", 160), ("dev", 80)):
    with open(os.path.join(directory, f"{split}.tsv"), "w", encoding="utf-8") as f:
      f.write("label\ttext\n")
      for i in range(n):
        text = list(rs.choice(words, size=rs.randint(2, 6)))
        for _ in range(3 if i % 2 else 0):  # a strong signal in mean-pooled features
          text.insert(rs.randint(len(text) + 1), "the")
        f.write(f"{'yes' if i % 2 else 'no'}\t{' '.join(text)}\n")
  return directory


def _probe_rows(workdir: str) -> list[dict]:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [r for r in map(json.loads, filter(str.strip, f)) if r["split"] == "probe"]


def _losses(workdir: str) -> dict[int, float]:
  """Per-step train loss from metrics.jsonl (written by process 0 only)."""
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(l) for l in f if l.strip()]
  steps = [r["step"] for r in rows if r["split"] == "train"]
  assert steps == list(range(steps[0], steps[0] + len(steps))), f"steps logged: {steps}"
  return {r["step"]: r["loss"] for r in rows if r["split"] == "train"}


def _resumed_at(stdout: str, step: int) -> bool:
  return re.search(rf"resumed .* at step {step}\b", stdout) is not None


@pytest.fixture(scope="module")
def runs(tmp_path_factory, request) -> dict:
  """Every launch of this module, independent ones side by side (2 cores).

  reference        1 process, 8 devices, steps 0-24 uninterrupted; prepares the data
  two_processes    2 processes x 4 devices, FSDP, on gs://bkt/two_processes: steps 0-12,
                   then a rerun resumes to 24
  device_counts    the reference's step-12 checkpoint on 1 device to 18, then 8 to 24

  The reference and the two processes also probe (`probes`) at steps 12 and 24.
  """
  root = tmp_path_factory.mktemp("distributed")
  jit, data, logs = str(root / "jit"), str(root / "data"), str(root / "logs")
  ref, counts = str(root / "reference"), str(root / "device_counts")
  # Each process writes its own shards of every checkpoint into the one bucket workdir.
  # (Each two-process launch costs process 1 a full compile: JAX writes the compilation
  # cache from process 0 only, and on CPU the processes' keys differ. So the bucket and
  # the local-disk two-process runs are one run here, not one each.)
  server = request.getfixturevalue("server") if gcs_server_binary() else None
  multi, local = ("gs://bkt/two_processes", os.path.join(server.root, "bkt", "two_processes")
                  ) if server else (str(root / "two_processes"),) * 2
  # Process 0 uses the reference's prepared data; process 1 has a cache of its
  # own (a host with local disk), which it must fill from process 0's vocabulary.
  pair_data = (data, str(root / "process1_local_data"))
  probes = [f"--config.probe.tasks=('word_order','{_write_task(str(root / 'has_the'))}')",
            "--config.probe.max_examples=80", f"--config.eval_every={HALF}"]

  def two_processes(steps: int) -> dict:
    return {name: ([*args, *probes, "--config.mesh.param_sharding=fsdp"], devices)
            for name, (args, devices) in _two_processes(multi, steps, pair_data).items()}

  args, devices = _one_process(ref, STEPS, 8, data)
  out = {"reference": _run({"ref": ([*args, *probes], devices)}, logs, jit)["ref"]}
  shutil.copytree(os.path.join(ref, "checkpoints", str(HALF)),
                  os.path.join(counts, "checkpoints", str(HALF)))
  first = _run({**two_processes(HALF),
                "one_device": _one_process(counts, HALF + HALF // 2, 1, data)}, logs + "1", jit)
  first_losses = _losses(local)
  second = _run({**two_processes(STEPS),
                 "eight_devices": _one_process(counts, STEPS, 8, data)}, logs + "2", jit)
  return {"reference": _losses(ref), "two_processes": _losses(local),
          "two_processes_first": first_losses, "device_counts": _losses(counts),
          "probes": {"reference": _probe_rows(ref), "two_processes": _probe_rows(local)},
          "complete": soak_kill.complete_steps(local, bucket=server is not None),
          "stdout": {**out, "first": first, "second": second}}


def test_two_processes_match_one_process_through_a_stop_and_resume(runs):
  # If the processes read overlapping or wrong shards of a global batch, or the
  # resume lost the data position or optimizer state, the losses would differ
  # by far more than float rounding (steps change the loss by ~1e-2).
  stdout = runs["stdout"]
  assert "8 cpu devices in 2 processes" in stdout["first"]["process0"]
  assert sorted(runs["two_processes_first"]) == list(range(1, HALF + 1))
  assert _resumed_at(stdout["second"]["process0"], HALF), stdout["second"]["process0"]
  losses, expected = runs["two_processes"], runs["reference"]
  assert sorted(losses) == sorted(expected) == list(range(1, STEPS + 1))
  np.testing.assert_allclose([losses[s] for s in sorted(losses)],
                             [expected[s] for s in sorted(expected)], rtol=0, atol=1e-5)
  assert runs["complete"] == [HALF, STEPS]  # both processes' shards of both checkpoints


def test_two_processes_log_the_probes_of_one_through_a_stop_and_resume(runs):
  expected, got = runs["probes"]["reference"], runs["probes"]["two_processes"]
  assert [r["step"] for r in got] == [r["step"] for r in expected] == [HALF, STEPS]
  for e, g in zip(expected, got):
    assert set(g) == set(e)
    assert e["has_the/accuracy"] >= 0.7  # random features read the word: a wrong gather not
    for key in e:
      if key.endswith("accuracy"):
        # Features agree to float rounding; at most one example may fall the other way.
        n = e[key.split("/")[0] + "/num_eval"]
        assert abs(g[key] - e[key]) <= 1.0 / n + 1e-9, (key, g[key], e[key])
      else:
        assert g[key] == pytest.approx(e[key], abs=1e-6), key  # majority, counts, step


def test_only_process_0_prints(runs):
  for launch in ("first", "second"):
    stdout = runs["stdout"][launch]
    assert f"probe @ {HALF if launch == 'first' else STEPS}: word_order accuracy " in stdout[
        "process0"], stdout["process0"]
    # Process 1 says only what it does alone: preparing its host-local data cache.
    lines = multiprocess.own_lines(stdout["process1"])
    assert [l for l in lines if not l.startswith(("Preparing ", "Prepared "))] == [], lines


def test_training_resumes_across_device_counts(runs):
  # 8 devices -> 1 -> 8. Reductions run in another order on another device
  # count, so the losses agree with the uninterrupted run to float rounding,
  # not bit for bit.
  stdout = runs["stdout"]
  one, eight = stdout["first"]["one_device"], stdout["second"]["eight_devices"]
  assert "1 cpu devices" in one and _resumed_at(one, HALF), one
  assert "8 cpu devices" in eight and _resumed_at(eight, HALF + HALF // 2), eight
  losses, expected = runs["device_counts"], runs["reference"]
  assert sorted(losses) == list(range(HALF + 1, STEPS + 1))
  np.testing.assert_allclose([losses[s] for s in sorted(losses)],
                             [expected[s] for s in sorted(losses)], rtol=1e-5, atol=0)


def test_a_failure_on_process_0_stops_both_processes_with_one_line_errors(tmp_path):
  # Process 0 cannot prepare the data (no such corpus): process 1, waiting for
  # its vocabulary, must stop too instead of hanging in a collective.
  missing = str(tmp_path / "missing.txt")
  launches = _two_processes(str(tmp_path / "run"), HALF,
                            (str(tmp_path / "data0"), str(tmp_path / "data1")))
  for args, _ in launches.values():
    args.append(f"--config.data.corpus={missing}")
  results = _launch(launches, str(tmp_path / "logs"), str(tmp_path / "jit"),
                    stop_on_failure=False)
  for name, (code, _, err) in results.items():
    errors = [l for l in err.splitlines() if l.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "missing.txt" in errors[0], _report(results)
  assert "process 0" in results["process1"][2]


def test_a_mixture_on_two_processes_of_4_devices_trains_as_one_of_8(tmp_path):
  # A Parquet and a .jsonl.zst source on a shared cache: the vocabulary process 0 trains
  # (here the one-process run's, found in the cache) and every source's preparation are
  # shared, and the rows drawn by weight are the same for any process count.
  from corpus_shapes import builtin_texts, write_jsonl, write_parquet
  texts = builtin_texts()
  web = write_parquet(str(tmp_path / "web.parquet"), texts[:50], row_group_size=8)
  code = write_jsonl(str(tmp_path / "code.jsonl"), texts[50:], ".zst")
  mix = ["--config.data.corpus=builtin",
         f"--config.data.sources=('web={web},weight=0.7', 'code={code},weight=0.3')"]
  cache, xla = str(tmp_path / "prepared"), str(tmp_path / "xla")
  one, two = str(tmp_path / "one"), str(tmp_path / "two")
  args, devices = _one_process(one, HALF, 8, cache)
  _run({"one": ([*args, *mix], devices)}, str(tmp_path / "logs1"), xla)
  launches = _two_processes(two, HALF, (cache, cache))
  outs = _run({k: ([*a, *mix], d) for k, (a, d) in launches.items()}, str(tmp_path / "logs2"),
              xla)
  assert "mixture: tokens drawn this session: web" in outs["process0"]
  rows = lambda w: {r["step"]: r for r in soak_kill.read_metrics(w) if r["split"] == "train"}
  a, b = rows(one), rows(two)
  assert sorted(a) == sorted(b) == list(range(1, HALF + 1))
  for step in a:  # the same rows: each source's tokens exactly, the losses to rounding
    assert [a[step][f"tokens_{n}"] for n in ("web", "code")] == [
        b[step][f"tokens_{n}"] for n in ("web", "code")]
    np.testing.assert_allclose(b[step]["loss"], a[step]["loss"], rtol=0, atol=1e-5)
