"""Whether the process that wrote a lock's holder record is provably gone, judged from this host's ``/proc``.

A holder record names its process by three values (:func:`identity`):

- ``host_id``: the kernel's boot id (``/proc/sys/kernel/random/boot_id``, random per boot, so two machines never
  share it) joined with this process's pid and time namespaces (``/proc/self/ns/pid``, ``/proc/self/ns/time``):
  two containers of one kernel with their own pid namespaces have different host ids, and a process id means
  the same process exactly where the host id is equal;
- ``pid``: the process id;
- ``pid_start``: the process's start time in clock ticks since boot (field 22 of ``/proc/<pid>/stat``), so a
  later process that got the same pid is told apart.

:func:`holder_gone` is True only when the record's host id is this process's and no process with that pid and
start time exists here (no such pid, a pid reused by a process started at another time, or a zombie with no
thread left). Anything it cannot prove (another host or namespace, a record without these fields, a ``/proc``
that is missing or belongs to another pid namespace, a process hidden by ``hidepid`` that ``kill(pid, 0)`` still
finds) counts as alive, and the caller falls back to its stale-time rule.
"""

from __future__ import annotations

import functools
import os
from typing import Any

BOOT_ID = "/proc/sys/kernel/random/boot_id"


@functools.cache
def host_id() -> str | None:
    """This host's id as holder records carry it (``<boot id>/pid:[N]/time:[N]``), or None where ``/proc``
    cannot tell (not Linux, no procfs, a procfs of another pid namespace)."""
    try:
        if os.readlink("/proc/self") != str(os.getpid()):
            return None  # this /proc shows another pid namespace's processes
        with open(BOOT_ID, encoding="ascii") as fh:
            boot = fh.read().strip()
        spaces = [os.readlink("/proc/self/ns/pid")]
        if os.path.lexists("/proc/self/ns/time"):
            spaces.append(os.readlink("/proc/self/ns/time"))
    except OSError:
        return None
    return "/".join([boot, *spaces]) if boot else None


def _stat(pid: int) -> tuple[str, int] | None:
    """``(state, start ticks)`` of process ``pid`` from ``/proc/<pid>/stat``; None when it has no entry."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            raw = fh.read()
    except OSError:
        return None
    fields = raw.rpartition(")")[2].split()  # the command name before it may hold spaces and parentheses
    try:
        return fields[0], int(fields[19])
    except (IndexError, ValueError):
        return None


def start_ticks(pid: int) -> int | None:
    """The start time of process ``pid`` on this host in clock ticks since boot; None when there is none."""
    stat = _stat(pid)
    return None if stat is None else stat[1]


def identity() -> dict[str, Any]:
    """This process's ``{host_id, pid, pid_start}`` for a holder record (``host_id`` and ``pid_start`` null
    where ``/proc`` cannot tell)."""
    pid = os.getpid()
    host = host_id()
    return {"host_id": host, "pid": pid, "pid_start": start_ticks(pid) if host else None}


def pid_alive(pid: int) -> bool:
    """Whether ``kill(pid, 0)`` finds a process with this id on this host (one of another user too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _exited(pid: int) -> bool:
    """Whether process ``pid`` (a zombie) has no thread left: it can run no code again."""
    try:
        return os.listdir(f"/proc/{pid}/task") in ([], [str(pid)])
    except OSError:
        return True  # reaped meanwhile


def holder_gone(info: dict[str, Any]) -> bool:
    """Whether the process a holder record names ran on this host and is provably gone (see the module)."""
    host, pid, start = info.get("host_id"), info.get("pid"), info.get("pid_start")
    if not (isinstance(host, str) and type(pid) is int and type(start) is int) or pid <= 0:
        return False
    if host != host_id():
        return False
    stat = _stat(pid)
    if stat is None:
        return not pid_alive(pid)  # an entry hidden from us (hidepid) is not proof
    state, ticks = stat
    if ticks != start:
        return True  # the pid now names a later process
    return state in ("Z", "X") and _exited(pid)
