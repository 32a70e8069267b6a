"""No process the suite starts outlives the process that started it (docs/distributed.md,
"Lifetime").

A run is a chain of processes: ``suite sweep launcher=local`` -> a cell's ``suite run nproc=N`` ->
torchrun's agent -> N ranks (or slurmstepd -> the ranks, under srun). When a link is killed, SIGKILL
included, everything below it must end, or a rank keeps its GPU's memory until someone finds it.
Each child ties itself to its parent in two ways:

- ``PR_SET_PDEATHSIG`` (Linux): the kernel sends the child a signal the moment its parent dies, even
  while the child is blocked in C++ without the GIL. It fires when the parent's *thread* that forked
  the child exits, so it is armed only where that thread lives as long as the parent (the suite and
  torchrun's agent start their children from the main thread; slurmstepd is multi-threaded: no).
- a watchdog thread (every platform): once ``os.getppid()`` is no longer the parent (the parent died
  and the child was re-parented), it sends the same signal to its own process, within
  ``PARENT_POLL_S``.

The parent names itself in the child's environment (``tied_env``), and the child arms both at its
start (``honour_tie``): no ``preexec_fn``, which is unsafe in a process with threads (a sweep draws
its progress bar from one). This module imports no torch: ``suite --help`` must stay fast.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

PARENT_POLL_S = 1.0
"""How often a watchdog thread checks that the process's parent is still there."""
TIE_ENV = "SUITE_TIED_TO"
"""``<parent pid>:<signal>``, set by a parent for a child it starts; the child removes it from its
environment, so that its own children do not take it for theirs."""
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

# parents this process already watches (dist.init may run more than once)
_watched: set[int] = set()


def tied_env(env: dict, sig: int, parent: int | None = None) -> dict:
    """``env`` for a child that must get ``sig`` when this process (or ``parent``, the child's
    parent-to-be: a fork server) dies (its ``honour_tie`` reads it)."""
    return {**env, TIE_ENV: f"{os.getpid() if parent is None else parent}:{int(sig)}"}


def honour_tie() -> None:
    """Called first thing by a process the suite started with ``tied_env``: die with that parent."""
    spec = os.environ.pop(TIE_ENV, None)
    if spec:
        parent, sig = (int(x) for x in spec.split(":"))
        die_with_parent(sig, parent)


def die_with_parent(sig: int, parent: int | None = None, pdeathsig: bool = True) -> None:
    """Send ``sig`` to this process when ``parent`` (default: the current parent) is gone.

    ``pdeathsig``: arm the kernel's parent-death signal too (Linux), only where the parent's forking
    thread lives as long as the parent (module docstring). A parent already gone ends this process
    now (it died before the signal was armed, so the kernel will never send it)."""
    parent = os.getppid() if parent is None else parent
    if parent in _watched:
        return
    if pdeathsig and sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig))
    # it died before the signal was armed: nothing of ours runs yet to stop
    if os.getppid() != parent:
        _say(parent, "exiting")
        os._exit(1)
    _watched.add(parent)
    threading.Thread(target=_watch, args=(parent, sig), name="suite-parent-watchdog",
                     daemon=True).start()


def _watch(parent: int, sig: int) -> None:
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    _say(parent, f"ending with {signal.Signals(sig).name}")
    # a signal, not an exit: torchrun's agent answers SIGTERM by stopping its ranks
    os.kill(os.getpid(), sig)


def _say(parent: int, what: str) -> None:
    print(f"suite: pid {os.getpid()}: its parent {parent} is gone; {what}", file=sys.stderr,
          flush=True)
