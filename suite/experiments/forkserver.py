"""A fork server for the local launcher: a sweep's CPU cells start from an already-imported process.

Each cell of ``suite sweep ... launcher=local`` (and ``suite main``) is a ``suite run``; started
as a fresh interpreter, it spends ~5 s of CPU importing torch, transformers and the suite before
its first step, and the main job runs dozens of cells two at a time on 2-core machines. Here the
imports happen once, in a **server** process, and each cell is an ``os.fork`` of it.

What is forked, and why it is safe:

- the server is a fresh ``python -m suite.experiments.forkserver`` (``subprocess``: fork + exec),
  never a fork of the sweep: the sweep draws its progress bar from a thread and builds policies
  with torch ops (OpenMP pools), and neither may be copied into a cell. The server only imports
  (``PRELOAD``): it runs no torch op (torch's OpenMP pool starts at the first parallel one) and
  starts no thread, and refuses to serve (the launcher falls back) when a Python thread runs after
  its imports. Native pools that start at import time do run in it, as in every ``suite run``:
  OpenBLAS's (numpy, scipy) and arrow's jemalloc background thread (pyarrow); both quiesce around
  a fork (``pthread_atfork``), which is what makes forking after ``import numpy`` everyday
  ``multiprocessing`` practice;
- a forked cell then is what ``python -m suite.cli run <overrides>`` would be: the environment the
  launcher would have passed to ``Popen`` (``os.environ`` replaced before anything runs), the
  launcher's working directory, ``log.txt`` on fds 1 and 2 (stdin: /dev/null), ``sys.argv``, and
  it ends through ``sys.exit(cli.entry(...))``, so its exit code, atexit handlers and uncaught
  exceptions are those of the interpreter. ``suite run`` sets its torch threads itself;
- only CPU cells of one rank (``eligible``). A GPU cell (CUDA state must not be inherited) or a
  cell of several ranks (torchrun) keeps its own subprocess.

Lifetime (suite/lifetime.py): a cell's parent is the server, so the cell is tied to the server
(``SUITE_TIED_TO=<server pid>:SIGTERM``, honoured by ``cli.main``); the server dies with the
sweep: the kernel's parent-death signal (armed only when the sweep started it from its main
thread) and, on every platform, the end of its command pipe, after which it stops its cells.

Protocol: JSON lines, the sweep writes ``{"argv", "env", "cwd", "log"}`` on the server's stdin;
the server answers on its stdout ``{"ready": pid}`` once, ``{"started": pid}`` per request and
``{"exit": pid, "code": c}`` per reaped cell (``c`` as Popen's returncode: -N when killed by
signal N). This module imports no torch at module level: the launcher imports it on the CLI's
path.
"""

from __future__ import annotations

import importlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
import warnings

OPT_OUT = "SUITE_FORKSERVER"
"""``SUITE_FORKSERVER=0``: every cell is its own ``suite run`` subprocess, as before."""
PDEATHSIG_ENV = "SUITE_FORKSERVER_PDEATHSIG"
PRELOAD = ("suite.cli", "suite.rl.train", "torch.distributed.checkpoint",
           "transformers.models.auto.modeling_auto", "transformers.models.auto.tokenization_auto",
           # what transformers' lazy modules import when the policy loads (~90 modules)
           "transformers.modeling_utils", "transformers.models.llama.modeling_llama")
"""What ``suite run`` imports before its first step (the ~5 s a cell saves)."""
READY_TIMEOUT_S = 300
"""How long the sweep waits for the server's imports (a guard against a hang, not a bound)."""
POLL_S = 0.05  # how often the server reaps its cells while no request comes


def warm() -> None:
    """Pure-Python work every cell would repeat, done once in the server: Hydra's first composition
    imports ~60 of its modules and fills its config store (0.7 s of a cell's 0.9-s config load on a
    2-core CPU), and its composition of the defaults is what every later one starts from (~10 ms
    each). It composes the defaults only, runs no torch op and starts no thread."""
    from suite.rl import compose

    compose.from_overrides([])


_said: set[str] = set()  # reasons for falling back already printed by this process


# ---- the sweep's side ----------------------------------------------------------------------------
def eligible(cell, gpus) -> bool:
    """A cell the server may start: one rank on this CPU, no GPU handed out."""
    return not gpus and cell.cfg.nproc == 1


def wanted() -> str | None:
    """None where a fork server may be used here, else why not."""
    if os.environ.get(OPT_OUT, "1") == "0":
        return f"{OPT_OUT}=0"
    if not sys.platform.startswith("linux"):
        # macOS forks unsafely once system frameworks are loaded (its multiprocessing default is
        # spawn); elsewhere there is no fork
        return f"no safe fork on {sys.platform}"
    return None


def start(env: dict, say, prepare=None) -> Server | None:
    """A ready server with the environment ``env``, or None (said once per reason via ``say``).
    ``prepare()`` runs while the server imports (a sweep's policy and data build, which the server's
    ~5 s of imports then overlap), whether or not a server starts."""
    why, server = wanted(), None
    if why is None:
        try:
            server = Server(env)  # its process starts importing
        # whatever stops the server stops only the saving: the cells start as before
        except Exception as e:  # noqa: BLE001
            why = f"{type(e).__name__}: {e}"
    try:
        if prepare is not None:
            prepare()
    except BaseException:
        if server is not None:
            server.close()
        raise
    if server is not None:
        try:
            server.ready()
            return server
        except Exception as e:  # noqa: BLE001
            why = f"{type(e).__name__}: {e}"
    if why != f"{OPT_OUT}=0" and why not in _said:
        _said.add(why)
        say(f"local launcher: no fork server ({why}); each cell is its own `suite run` process")
    return None


class Server:
    """The sweep's handle on its fork server."""

    def __init__(self, env: dict):
        main = threading.current_thread() is threading.main_thread()
        env = {**env, "PYTHONUNBUFFERED": "1", PDEATHSIG_ENV: "1" if main else "0"}
        self.proc = subprocess.Popen([sys.executable, "-m", "suite.experiments.forkserver"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self.pid = self.proc.pid
        self._buf, self._exits, self.alive = b"", {}, True
        self._cells: dict[int, Forked] = {}

    def ready(self) -> None:
        """Wait until the server has imported what it preloads; RuntimeError (the server closed)
        where it will not serve."""
        msg = self._next(lambda m: "ready" in m or "unsafe" in m, READY_TIMEOUT_S)
        if msg is None or "unsafe" in msg:
            self.close()
            raise RuntimeError(msg["unsafe"] if msg else
                               f"the fork server exited with code {self.proc.poll()} before it "
                               "was ready")

    def spawn(self, argv: list[str], env: dict, log) -> Forked:
        """Fork a cell: ``argv`` after ``suite``, e.g. ``["run", *overrides]``."""
        req = {"argv": argv, "env": env, "cwd": os.getcwd(), "log": str(log)}
        self.proc.stdin.write(json.dumps(req).encode() + b"\n")
        self.proc.stdin.flush()
        msg = self._next(lambda m: "started" in m, READY_TIMEOUT_S)
        if msg is None:
            self.close()  # a hung server must not start the cell later, beside its subprocess
            raise RuntimeError("the fork server ended before starting the cell")
        cell = self._cells[msg["started"]] = Forked(self, msg["started"], argv)
        return cell

    def collect(self) -> None:
        """Read what the server has said (without waiting) and settle the cells that ended."""
        self._next(lambda m: False, 0)

    def close(self) -> None:
        """End the server: it stops any cell still running (none, after a finished sweep)."""
        if self.proc.stdin and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._lost()

    def _next(self, want, timeout: float) -> dict | None:
        """Handle the server's messages until one satisfies ``want`` (returned) or ``timeout``
        passes or the server has gone (None)."""
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while True:
            while b"\n" in self._buf:
                line, self._buf = self._buf.split(b"\n", 1)
                msg = json.loads(line)
                if "exit" in msg:
                    self._settle(msg["exit"], msg["code"])
                elif want(msg):
                    return msg
            if not self.alive:
                return None
            left = deadline - time.monotonic()
            if not select.select([fd], [], [], max(left, 0))[0]:
                return None
            data = os.read(fd, 1 << 16)
            if not data:
                self._lost()
                return None
            self._buf += data

    def _settle(self, pid: int, code: int) -> None:
        cell = self._cells.pop(pid, None)
        if cell is not None:
            cell.returncode = code

    def _lost(self) -> None:
        """The server is gone: its cells got their parent-death signal (SIGTERM)."""
        self.alive = False
        for pid in list(self._cells):
            self._settle(pid, -signal.SIGTERM)


class Forked:
    """A forked cell with what the launcher uses of a ``Popen``: pid, returncode, poll, wait,
    terminate, kill."""

    def __init__(self, server: Server, pid: int, args: list[str]):
        self.server, self.pid, self.args, self.returncode = server, pid, args, None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.server.collect()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(POLL_S)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        # not after it was reaped: its pid may name another process by now
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


# ---- the server ----------------------------------------------------------------------------------
def serve() -> dict | None:
    """The server's loop. Returns None in the server (the sweep has gone); in a forked cell, the
    cell's request (run by ``run_cell``, outside the server's frames)."""
    if os.environ.pop(PDEATHSIG_ENV, "0") == "1" and sys.platform.startswith("linux"):
        import ctypes

        from suite.lifetime import PR_SET_PDEATHSIG

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
    parent = os.getppid()
    # the protocol gets fds of its own; fds 0, 1 become what a cell's are not yet (/dev/null,
    # the sweep's stderr), so that nothing printed at import time can break a message
    cmd_in, out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    # Ctrl-C reaches the whole process group: the sweep decides, then closes the pipe
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for name in PRELOAD:
        importlib.import_module(name)
    warm()
    if threading.active_count() != 1 or os.getppid() != parent:
        names = [t.name for t in threading.enumerate()]
        _send(out, {"unsafe": f"Python threads {names} run after its imports; a fork copies only "
                              "the one forking"})
        return None
    _send(out, {"ready": os.getpid(), "native_threads": _native_threads()})
    buf, cells = b"", set()
    while True:
        readable = select.select([cmd_in], [], [], POLL_S)[0]
        _reap(out, cells)
        if not readable:
            continue
        data = os.read(cmd_in, 1 << 16)
        if not data:  # the sweep has gone (or is done): no cell outlives it
            for pid in cells:
                _kill(pid, signal.SIGTERM)
            return None
        buf += data
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            req = json.loads(line)
            with warnings.catch_warnings():
                # Python >= 3.12 warns of any native thread; those here quiesce (module docstring)
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
            if pid == 0:
                os.close(cmd_in)
                os.close(out)
                signal.signal(signal.SIGINT, signal.default_int_handler)
                return req
            cells.add(pid)
            _send(out, {"started": pid})


def run_cell(req: dict) -> None:
    """In the forked cell: become ``python -m suite.cli <argv>`` writing to its log, and exit."""
    log = os.open(req["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.environ.clear()
    os.environ.update(req["env"])
    os.chdir(req["cwd"])
    # the cell's entry point, as `python -m suite.cli` would be; by name (imported by PRELOAD
    # already), so that the launcher's modules do not import the CLI that imports them
    cli = importlib.import_module("suite.cli")
    sys.argv = [cli.__file__, *req["argv"]]
    sys.exit(cli.entry(req["argv"]))


def _reap(out: int, cells: set) -> None:
    while cells:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        cells.discard(pid)
        _send(out, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _send(fd: int, msg: dict) -> None:
    os.write(fd, json.dumps(msg).encode() + b"\n")


def _native_threads() -> list[str]:
    """The names of this process's OS threads (the first is the main one): /proc on Linux."""
    try:
        return [open(f"/proc/self/task/{t}/comm").read().strip()
                for t in sorted(os.listdir("/proc/self/task"), key=int)]
    except OSError:
        return []


if __name__ == "__main__":
    _req = serve()
    if _req is not None:
        run_cell(_req)
