"""A small Ray cluster on this machine (a head and worker nodes on 127.0.0.1), for tests and benchmarks.

Every process of the cluster is started with a private ``--temp-dir`` and every port chosen free, so it shares
nothing with any other Ray on the machine; :meth:`LocalCluster.stop` ends exactly the processes whose command
lines name that folder (by process id, never by name), then removes the folder.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

MB = 1 << 20


def free_port() -> int:
    """A TCP port nothing listens on at 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ray_cli() -> list[str]:
    return [sys.executable, "-c", "import sys; from ray.scripts.scripts import main; sys.exit(main())"]


@dataclass
class LocalCluster:
    """``workers`` worker nodes besides the head, ``cpus`` CPUs and ``object_store_mb`` of object store each (the
    head holds ``head_cpus`` CPUs: 0 keeps the work on the workers). :attr:`address` is what ``RAY_ADDRESS`` takes."""

    workers: int = 1
    cpus: int = 1
    head_cpus: int = 1
    object_store_mb: int = 256
    temp_dir: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="prl-ray-", dir="/tmp"))
    address: str = ""

    def _node_ports(self) -> list[str]:
        ports = {
            "--node-manager-port": free_port(),
            "--object-manager-port": free_port(),
            "--dashboard-agent-listen-port": free_port(),
            "--dashboard-agent-grpc-port": free_port(),
            "--runtime-env-agent-port": free_port(),
            "--metrics-export-port": free_port(),
        }
        return [f"{k}={v}" for k, v in ports.items()]

    def _start(self, args: list[str], cpus: int) -> None:
        common = [
            "--node-ip-address=127.0.0.1",
            f"--num-cpus={cpus}",
            f"--object-store-memory={self.object_store_mb * MB}",
            f"--temp-dir={self.temp_dir}",
            "--disable-usage-stats",
            *self._node_ports(),
        ]
        env = {**os.environ, **self.auth_env, "RAY_USAGE_STATS_ENABLED": "0"}
        env.pop("RAY_ADDRESS", None)
        proc = subprocess.run([*_ray_cli(), "start", *args, *common], capture_output=True, text=True, env=env)
        if proc.returncode:
            self.stop()
            raise RuntimeError(f"ray start failed ({proc.returncode}): {proc.stderr[-2000:] or proc.stdout[-2000:]}")

    @property
    def auth_env(self) -> dict[str, str]:
        """Environment of every process of the cluster, and of a driver that joins it: Ray's token
        authentication, with the cluster's own token (in its folder, never printed)."""
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": os.path.join(self.temp_dir, "auth_token")}

    @property
    def env(self) -> dict[str, str]:
        """What a driver sets to join the cluster: ``RAY_ADDRESS`` and :attr:`auth_env`."""
        return {"RAY_ADDRESS": self.address, **self.auth_env}

    def start(self) -> LocalCluster:
        """Start the head, then the workers; returns self with :attr:`address` set."""
        token = os.path.join(self.temp_dir, "auth_token")
        fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(32))
        port = free_port()
        self.address = f"127.0.0.1:{port}"
        head = ["--head", f"--port={port}", "--include-dashboard=false"]
        self._start(head, self.head_cpus)
        for _ in range(self.workers):
            self._start([f"--address={self.address}"], self.cpus)
        return self

    def pids(self) -> list[int]:
        """This user's processes that belong to the cluster (read from ``/proc``): those whose command line names
        the cluster's folder, and those holding a file open inside it (Ray's agents rename their command line)."""
        mine = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                if os.stat(f"/proc/{entry}").st_uid != os.getuid():
                    continue
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    cmdline = fh.read().replace(b"\0", b" ").decode(errors="replace")
                if self.temp_dir in cmdline or self._holds_file(int(entry)):
                    mine.append(int(entry))
            except OSError:
                continue
        return mine

    def _holds_file(self, pid: int) -> bool:
        inside = self.temp_dir.rstrip("/") + "/"
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(inside):
                    return True
        return False

    def stop(self, grace_s: float = 10.0) -> None:
        """End the cluster's processes (SIGTERM, then SIGKILL to those left after ``grace_s``) and remove its
        folder."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            pids = self.pids()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + grace_s
            while pids and time.monotonic() < deadline:
                time.sleep(0.2)
                pids = self.pids()
            if not pids:
                break
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["LocalCluster", "free_port"]
