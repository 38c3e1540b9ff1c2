"""Start-up guards of an explicit multi-process run, in front of jax.distributed.initialize.

Only with --coordinator_address/--num_processes/--process_id (auto-detected
clusters such as TPU pods assign the ids themselves). JAX's coordination
service takes a second process with a taken id for a restart of that task
and aborts every process of the run, so a wrong command could kill a live
run; and two process 0s started at once on one host can both find the port
free. So, before any process calls JAX:

  process 0   guard_process_0: holds a host-local flock for coordinator port P
              for its whole life (a second process 0 on this host stops at
              once, naming the holder), asks the address's roster whether a
              process 0 already runs there (one on another host), checks that
              P is free, and serves the roster on port P+1 in a daemon thread.
  the others  join: connect to the roster (bounded by --distributed_timeout),
              send (process_id, num_processes, host, pid), and keep the
              connection open for life; a refusal is one ConfigError line.

The roster refuses an id held by a live connection (naming its holder) and a
--num_processes other than process 0's. A holder's connection closes when it
dies, however it dies (kill -9 included), which frees its id for a restart.
"""

from __future__ import annotations

import errno
import json
import os
import select
import socket
import tempfile
import threading
import time
from typing import Optional

from bert_jax.errors import ConfigError
from bert_jax.storage.workdir_lock import Held, describe, flock_exclusive, holder_record

_HELLO_TIMEOUT_S = 10.0  # a connection that sends nothing is dropped after this


def split_address(address: str) -> tuple[str, int]:
  """'host:port' (or '[v6]:port') -> (host, port); one ConfigError line otherwise."""
  host, sep, port = address.rpartition(":")
  host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
  if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
    raise ConfigError(f"--coordinator_address={address!r}: expected host:port, e.g. "
                      "127.0.0.1:12345")
  return host, int(port)


def roster_port(port: int, address: str) -> int:
  if port >= 65535:
    raise ConfigError(f"--coordinator_address={address}: port {port} leaves no port {port}+1 "
                      "for bert-jax's start-up roster; expected a port below 65535")
  return port + 1


def lock_path(port: int) -> str:
  return os.path.join(tempfile.gettempdir(), f"bert-jax-coordinator-{int(port)}.lock")


def lock_coordinator_port(port: int, address: str) -> Optional[int]:
  """flock on this host's lock file of `port`; returns its fd, to keep open for life.

  The kernel drops the lock when the process dies, so it is never stale.
  Returns None (no lock; the port check still runs) where the lock file of
  another user cannot be opened: a guard in front of the port check must
  not itself stop a run.
  """
  path = lock_path(port)
  try:
    try:  # no O_CREAT on an existing file: /tmp's protected_regular forbids it for others' files
      fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
      fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
      try:
        os.fchmod(fd, 0o666)  # the next user of this port may be someone else
      except OSError:
        pass
  except OSError:
    return None
  try:
    flock_exclusive(fd)
  except Held as e:
    raise ConfigError(f"--coordinator_address={address}: port {port} is already in use by "
                      f"another bert-jax process 0 on this host ({describe(e.holder)}; lock "
                      f"{path}); expected one --process_id=0 per run: wait for that run to "
                      "end or give this one another port") from None
  except OSError:
    return None
  try:
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(holder_record(port=port)) + "\n").encode(), 0)
  except OSError:
    pass  # e.g. a full temporary directory: the lock holds, only its error names no holder
  return fd


def check_port_free(host: str, port: int, address: str) -> None:
  """Process 0's coordinator binds [::]:port (all addresses): is that port free?"""
  bind_address = os.environ.get("JAX_COORDINATOR_BIND_ADDRESS")
  targets = [(split_address(bind_address)[0], port)] if bind_address else []
  targets += [("::", port), ("0.0.0.0", port), (host, port)]
  for target in targets:
    family = socket.AF_INET6 if ":" in target[0] else socket.AF_INET
    try:
      with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is no obstacle
        s.bind(target)
    except OSError as e:
      if e.errno == errno.EADDRINUSE:
        raise ConfigError(f"--coordinator_address={address}: port {port} is already in use on "
                          "this host (another run, or a process given --process_id=0 twice?); "
                          "expected a free port for process 0's coordinator") from None
      continue  # e.g. no IPv6 here, or `host` is not this machine's: nothing to learn


class Roster:
  """Process 0's roster of the run's ids, served on a daemon thread until close()."""

  def __init__(self, listener: socket.socket, num_processes: int):
    self.port = listener.getsockname()[1]
    self._listener = listener
    self._num_processes = num_processes
    self._mutex = threading.Lock()
    self._closed = threading.Event()
    # id -> (its connection, its record); process 0 is here for as long as the roster.
    self._held: dict[int, tuple[Optional[socket.socket], dict]] = {
        0: (None, holder_record(process_id=0))}
    threading.Thread(target=self._serve, name="bert_jax-roster", daemon=True).start()

  def close(self) -> None:
    self._closed.set()
    self._listener.close()
    with self._mutex:
      for conn, _ in self._held.values():
        if conn is not None:
          conn.close()
      self._held.clear()

  def _serve(self) -> None:
    while not self._closed.is_set():
      try:
        conn, _ = self._listener.accept()
      except socket.timeout:
        continue
      except OSError:
        return  # closed
      threading.Thread(target=self._handshake, args=(conn,), name="bert_jax-roster-join",
                       daemon=True).start()

  def _handshake(self, conn: socket.socket) -> None:
    try:
      conn.settimeout(_HELLO_TIMEOUT_S)
      hello = json.loads(_read_line(conn))
      refusal = self._admit(hello, conn)
      conn.sendall((json.dumps({"ok": refusal is None, "error": refusal}) + "\n").encode())
      if refusal is None:
        conn.settimeout(None)  # the holder's connection now only waits to be closed
        return
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
      pass  # not a bert-jax process, or it went away mid-hello: it holds nothing
    conn.close()

  def _admit(self, hello: dict, conn: socket.socket) -> Optional[str]:
    """None if `hello`'s id is now held by `conn`, else why not (one line)."""
    i, n = int(hello["process_id"]), int(hello["num_processes"])
    with self._mutex:
      held = self._held.get(i)
      if held is not None and (held[0] is None or _alive(held[0])):
        return (f"--process_id={i} is already taken in this run by pid "
                f"{held[1].get('pid', '?')} on host {held[1].get('host', '?')} (joined "
                f"{held[1].get('started', '?')}); expected each --process_id "
                f"0..{self._num_processes - 1} once (joining with a taken id would abort the "
                "whole run)")
      if n != self._num_processes:
        _, zero = self._held[0]
        return (f"--num_processes={n}: process 0 of this run ({describe(zero)}) has "
                f"--num_processes={self._num_processes}; expected the same --num_processes "
                "on every process")
      if not 0 <= i < n:
        return f"--process_id={i}: expected 0 <= process_id < --num_processes={n}"
      if held is not None:
        held[0].close()  # its holder died: the id is free for a restart
      self._held[i] = (conn, {"pid": hello.get("pid", "?"), "host": hello.get("host", "?"),
                              "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())})
    return None


def _alive(conn: socket.socket) -> bool:
  """A holder sends nothing after its hello: readable with b'' (or a reset) means it is gone."""
  # poll, not a timed recv: a holder still in its own handshake has a timeout
  # set, and a recv would wait out that timeout under the mutex.
  try:
    poller = select.poll()
    poller.register(conn, select.POLLIN)
    return not poller.poll(0) or conn.recv(1, socket.MSG_PEEK) != b""
  except OSError:
    return False


def serve_roster(port: int, address: str, num_processes: int) -> Roster:
  """Binds port+1 on every address (or JAX_COORDINATOR_BIND_ADDRESS's host) and serves."""
  port = roster_port(port, address)
  bind_address = os.environ.get("JAX_COORDINATOR_BIND_ADDRESS")
  targets = [split_address(bind_address)[0]] if bind_address else ["::", "0.0.0.0"]
  error = None
  for host in targets:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
      listener = socket.socket(family, socket.SOCK_STREAM)
    except OSError as e:  # no IPv6 on this host
      error = e
      continue
    try:
      listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
      if family == socket.AF_INET6:
        listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
      listener.bind((host, port))
      listener.listen(64)
      listener.settimeout(0.5)  # lets close() end the accept loop
      return Roster(listener, num_processes)
    except OSError as e:
      listener.close()
      error = e
      if e.errno == errno.EADDRINUSE:
        break
  raise ConfigError(f"--coordinator_address={address}: cannot listen on port {port} "
                    f"({error.strerror if error else 'no address'}), which bert-jax's start-up "
                    f"roster needs next to the coordinator port {port - 1}; expected ports "
                    f"{port - 1} and {port} free: give the run another port")


def guard_process_0(host: str, port: int, address: str, num_processes: int
                    ) -> tuple[Optional[int], Roster]:
  """Process 0: the port lock, the port check, the roster; keep both for the process's life."""
  roster_port(port, address)
  fd = lock_coordinator_port(port, address)
  try:
    _refuse_if_a_run_answers(host, port, address, num_processes)
    check_port_free(host, port, address)
    return fd, serve_roster(port, address, num_processes)
  except BaseException:
    if fd is not None:
      os.close(fd)
    raise


def _refuse_if_a_run_answers(host: str, port: int, address: str, num_processes: int) -> None:
  """A live roster at the address means a process 0 elsewhere (the lock covers this host).

  Its coordinator would take this process's JAX client for a restart of task 0
  and abort its run. Nothing there, or something that is not a roster, is no
  answer: the port check and the roster's bind report a busy port.
  """
  try:
    with socket.create_connection((host, port + 1), timeout=2.0) as conn:
      conn.settimeout(2.0)
      conn.sendall(_hello(0, num_processes))
      reply = json.loads(_read_line(conn))
  except (OSError, ValueError):
    return
  if isinstance(reply, dict) and reply.get("ok") is False and reply.get("error"):
    raise ConfigError(str(reply["error"]))


def _hello(process_id: int, num_processes: int) -> bytes:
  return (json.dumps({"process_id": process_id, "num_processes": num_processes,
                      "host": socket.gethostname(), "pid": os.getpid()}) + "\n").encode()


def join(host: str, port: int, address: str, process_id: int, num_processes: int,
         timeout: float) -> socket.socket:
  """A process other than 0 takes its id at process 0's roster; keep the socket for life."""
  rport = roster_port(port, address)
  deadline = time.monotonic() + timeout
  while True:
    try:
      conn = socket.create_connection((host, rport), timeout=min(5.0, timeout))
      break
    except socket.gaierror as e:
      raise ConfigError(f"--coordinator_address={address}: cannot resolve {host!r} "
                        f"({e.strerror}); expected process 0's host name or address") from None
    except OSError:
      if time.monotonic() >= deadline:
        raise ConfigError(
            f"process {process_id}: nothing listens at --coordinator_address={address} (nor "
            f"at its roster port {rport}) after --distributed_timeout={timeout:g} s; expected "
            "process 0 of the run started with the same --coordinator_address (is any process "
            "given --process_id=0?)") from None
      time.sleep(0.5)
  try:
    conn.settimeout(max(5.0, deadline - time.monotonic()))
    conn.sendall(_hello(process_id, num_processes))
    reply = json.loads(_read_line(conn))
    ok, refusal = bool(reply["ok"]), str(reply.get("error"))
  except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
    conn.close()
    raise ConfigError(f"--coordinator_address={address}: port {rport} did not answer as "
                      f"bert-jax's start-up roster ({type(e).__name__}); expected process 0 of "
                      "this run (bert-jax) listening there") from None
  if not ok:
    conn.close()
    raise ConfigError(refusal)
  conn.settimeout(None)
  return conn


def _read_line(conn: socket.socket, limit: int = 4096) -> str:
  data = b""
  while not data.endswith(b"\n"):
    chunk = conn.recv(limit)
    if not chunk or len(data) + len(chunk) > limit:
      raise ValueError("no complete line")
    data += chunk
  return data.decode("utf-8")
