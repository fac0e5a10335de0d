"""Store-step locks on S3: the contract of :class:`prl.store.locks.LocalLock`, built from S3 conditional writes.

The lock is the object ``STORE/_locks/<step>.lock`` holding the holder record (:mod:`prl.store.holder`).

- **acquire**: ``PutObject`` with ``If-None-Match: *``; exactly one of any number of racing writers creates it.
- **heartbeat**: every ``HEARTBEAT_SECONDS`` the holder re-puts the object with ``If-Match: <its ETag>``, which
  moves ``LastModified``. The body changes each time (``heartbeat_at``), so the ETag changes too. A failed
  condition means another run took the lock over: :attr:`S3Lock.lost` becomes True and the heartbeat stops.
  :meth:`S3Lock.still_held` beats once more, now: every commit asks it first, so a run whose lock was taken
  over commits nothing after that (:class:`prl.errors.LockLostError`, exit 3).
- **stale**: the heartbeat is older than ``stale_after`` seconds, measured on the server's clock
  (response ``Date`` − ``LastModified``), so clock skew between hosts does not matter.
- **dead on this host**: a lock whose record names a process of this host (same boot and pid namespace, not
  merely the same host name, which containers sharing a bucket may share) that is provably gone, pid reuse
  included (:func:`prl.store.liveness.holder_gone`), may be taken over at once: cron on the host where a run
  was killed does not wait out the stale time. Locks of other hosts keep the stale rule.
- **takeover**: a stale or dead holder's lock is replaced with ``If-Match: <the ETag judged>``; after the first
  breaker's put the ETag differs, so two breakers cannot both win, and a holder whose heartbeat lands first
  keeps it.
- **release**: ``DeleteObject`` with ``If-Match: <its ETag>``: a run never deletes a lock it no longer holds.

Credentials come from the standard AWS chain (environment, profile, instance role); they are never logged.
"""

from __future__ import annotations

import email.utils
import hashlib
import json
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prl.errors import LockedError, RetryableIOError, UsageError
from prl.io.locations import aws_endpoint, aws_max_retries, aws_region, split_s3
from prl.store import holder, liveness

if TYPE_CHECKING:
    from botocore.exceptions import BotoCoreError, ClientError

log = logging.getLogger(__name__)

CONDITION_FAILED = {"PreconditionFailed", "ConditionalRequestConflict", "412", "409"}
"""Error codes of a failed ``If-Match`` / ``If-None-Match`` (409: a concurrent conditional write is in flight)."""
GONE = {"NoSuchKey", "404"}


DEFAULT_ATTEMPTS = 4
"""Attempts per request of prl's own S3 client (locks, log reads, S3 OUTs) where ``AWS_MAX_ATTEMPTS`` is unset."""


def s3_client() -> Any:
    """A boto3 S3 client for the standard AWS environment (``AWS_ENDPOINT_URL[_S3]``, ``AWS_REGION``), making
    ``AWS_MAX_ATTEMPTS`` attempts per request (:data:`DEFAULT_ATTEMPTS` where it is unset; an explicit retry
    setting would otherwise override the variable)."""
    try:  # loaded here, not with the module: a command on a local store never pays for boto3
        import boto3
        from botocore.config import Config
    except ImportError:  # pragma: no cover - depends on the installation
        raise UsageError("s3:// stores need boto3 for their locks: pip install 'prl[s3]'") from None
    retries = aws_max_retries()
    attempts = DEFAULT_ATTEMPTS if retries is None else retries + 1
    config = Config(retries={"total_max_attempts": attempts, "mode": "standard"}, connect_timeout=10, read_timeout=30)
    return boto3.client("s3", endpoint_url=aws_endpoint(), region_name=aws_region(), config=config)


_clients: dict[tuple[str | None, ...], Any] = {}
_clients_mutex = threading.Lock()
CLIENT_ENVIRONMENT = (
    "AWS_PROFILE",
    "AWS_ACCESS_KEY_ID",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CONFIG_FILE",
    "AWS_MAX_ATTEMPTS",
)
"""Variables besides the endpoint and region that decide what a client talks to as whom, and how often it tries."""
SECRET_ENVIRONMENT = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
"""Credentials that also decide it: a client is kept per digest of their values (never the values themselves),
so a rotated secret or session token gets a new client."""


def _errors() -> tuple[type[ClientError], type[BotoCoreError]]:
    """botocore's error classes (loaded by then: a request that can raise them needed a client)."""
    from botocore.exceptions import BotoCoreError, ClientError

    return ClientError, BotoCoreError


def _forget_clients() -> None:
    """In a forked child: no client (and no held mutex) of the parent's; it never shares their connections."""
    global _clients_mutex
    _clients.clear()
    _clients_mutex = threading.Lock()


os.register_at_fork(after_in_child=_forget_clients)


def shared_s3_client() -> Any:
    """The :func:`s3_client` of this process for the current environment (endpoint, region, profile, key id),
    made on first use: making a client costs more CPU than most requests (botocore builds its S3 model and
    endpoint rules anew), and boto3 clients are safe to share between threads. A forked child makes its own."""
    secrets = hashlib.sha256("\0".join(os.environ.get(name, "") for name in SECRET_ENVIRONMENT).encode()).hexdigest()
    environment = (aws_endpoint(), aws_region(), *(os.environ.get(name) for name in CLIENT_ENVIRONMENT), secrets)
    with _clients_mutex:
        client = _clients.get(environment)
        if client is None:
            client = _clients[environment] = s3_client()
    return client


def log_object(store_uri: str, key: str) -> bytes | None:
    """The body of object ``key`` under the ``s3://`` store at ``store_uri`` in one GET (None when there is no
    such object), through :func:`shared_s3_client`. A failed request is an :class:`OSError`, as the
    filesystems' are."""
    client = shared_s3_client()
    bucket, prefix = split_s3(store_uri)
    client_error, botocore_error = _errors()
    try:
        return bytes(client.get_object(Bucket=bucket, Key=f"{prefix}/{key}" if prefix else key)["Body"].read())
    except client_error as exc:
        if _code(exc) in GONE:
            return None
        raise OSError(f"reading s3://{bucket}/{prefix}/{key} failed: {_code(exc)}") from exc
    except botocore_error as exc:
        raise OSError(f"reading s3://{bucket}/{prefix}/{key} failed: {exc}") from exc


def put_object(store_uri: str, key: str, body: bytes) -> None:
    """Write object ``key`` under the ``s3://`` store at ``store_uri`` in one PUT (atomic: a reader sees the
    whole body or the object before it). A failed request is an :class:`OSError`."""
    client = shared_s3_client()
    bucket, prefix = split_s3(store_uri)
    client_error, botocore_error = _errors()
    try:
        client.put_object(Bucket=bucket, Key=f"{prefix}/{key}" if prefix else key, Body=body)
    except client_error as exc:
        raise OSError(f"writing s3://{bucket}/{prefix}/{key} failed: {_code(exc)}") from exc
    except botocore_error as exc:
        raise OSError(f"writing s3://{bucket}/{prefix}/{key} failed: {exc}") from exc


def _code(exc: ClientError) -> str:
    """The S3 error code of a failed request (its HTTP status where the body named none)."""
    code = str(exc.response.get("Error", {}).get("Code", ""))
    status = str(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
    return code if code and not code.isdigit() else status or code


@dataclass(eq=False)
class S3Lock:
    """An exclusive lock on one step of the store at ``store_uri`` (``s3://bucket/prefix``). Use as a context
    manager. ``stale_after`` is in seconds (judged at one-second resolution, the resolution of S3 times)."""

    store_uri: str
    step: str
    stale_after: float = holder.STALE_AFTER_SECONDS
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    lost: bool = False
    """True once another run has taken the lock over from this one (a heartbeat found a different ETag)."""
    _started_at: str = field(default="", repr=False)
    _etag: str | None = field(default=None, repr=False)
    _client: Any = field(default=None, repr=False)
    _mutex: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _heartbeat: holder.Heartbeat | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.store_uri.startswith("s3://"):
            raise UsageError(f"S3Lock needs an s3:// store, not {self.store_uri!r}")
        self.bucket, prefix = split_s3(self.store_uri)
        self.key = f"{prefix}/_locks/{self.step}.lock" if prefix else f"_locks/{self.step}.lock"

    @property
    def path(self) -> str:
        """The lock object's URI."""
        return f"s3://{self.bucket}/{self.key}"

    @property
    def client(self) -> Any:
        """The process's client for the environment as it was when the lock first needed one."""
        if self._client is None:
            self._client = shared_s3_client()
        return self._client

    def _body(self) -> bytes:
        return json.dumps(holder.holder_record(self.run_id, self.step, self._started_at or holder.utc_now())).encode()

    def _io_error(self, action: str, exc: Exception) -> RetryableIOError:
        return RetryableIOError(f"{action} the {self.step} lock at {self.path} failed: {exc}")

    def _read(self) -> tuple[dict[str, Any], str, float] | None:
        """The current lock: ``(holder info, ETag, heartbeat age in seconds)``; None when there is none."""
        client = self.client
        client_error, botocore_error = _errors()
        try:
            response = client.get_object(Bucket=self.bucket, Key=self.key)
            raw = response["Body"].read()
        except client_error as exc:
            if _code(exc) in GONE:
                return None
            raise self._io_error("reading", exc) from exc
        except botocore_error as exc:
            raise self._io_error("reading", exc) from exc
        try:
            info = json.loads(raw)
            info = info if isinstance(info, dict) else {}
        except ValueError:
            info = {}  # damaged: judged by its age alone
        server_now = response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
        now = email.utils.parsedate_to_datetime(server_now).timestamp() if server_now else time.time()
        age = now - response["LastModified"].timestamp()
        return info, response["ETag"], age

    def _put(self, action: str, **condition: str) -> str | None:
        """Put this run's holder info under ``condition``; its new ETag, or None when the condition failed."""
        client = self.client
        client_error, botocore_error = _errors()
        try:
            response = client.put_object(
                Bucket=self.bucket, Key=self.key, Body=self._body(), ContentType="application/json", **condition
            )
        except client_error as exc:
            if _code(exc) in CONDITION_FAILED | GONE:
                return None
            raise self._io_error(action, exc) from exc
        except botocore_error as exc:
            raise self._io_error(action, exc) from exc
        return str(response["ETag"])

    def acquire(self) -> None:
        """Take the lock, or raise :class:`LockedError` naming the live holder (or
        :class:`RetryableIOError` when S3 cannot be reached)."""
        self._started_at = holder.utc_now()
        self.lost = False
        for _ in range(5):
            etag = self._put("taking", IfNoneMatch="*")
            if etag is None:
                current = self._read()
                if current is None:
                    continue  # released between our put and our read
                info, stale_etag, age = current
                if info.get("run_id") == self.run_id:
                    etag = stale_etag  # our own put landed and its answer was lost: the lock is ours
                elif age <= self.stale_after and not liveness.holder_gone(info):
                    raise LockedError(holder.held_message(self.step, info, self.path))
                else:
                    etag = self._take_over(info, stale_etag, age)
                if etag is None:
                    continue
            self._etag = etag
            self._heartbeat = holder.Heartbeat(f"prl-s3lock-{self.step}", self.heartbeat)
            self._heartbeat.start()
            return
        raise LockedError(f"could not take the {self.step} lock at {self.path} (contended)")

    def _take_over(self, info: dict[str, Any], stale_etag: str, age: float) -> str | None:
        """Replace the stale (or dead holder's) lock judged by its ETag; our new ETag, or None when another
        breaker (or its holder's heartbeat) came first."""
        why = f"no heartbeat for {age:.0f} s" if age > self.stale_after else "its process on this host is gone"
        log.warning("taking over the %s lock of %s (%s)", self.step, info.get("holder", "unknown holder"), why)
        return self._put("taking over", IfMatch=stale_etag)  # only the first breaker's condition holds

    def heartbeat(self) -> bool:
        """Refresh the lock's ``LastModified`` now; False when the lock was taken over (see :attr:`lost`). A
        beat that cannot reach S3 is logged and counts as held: the next one may get through."""
        try:
            return self._beat()
        except RetryableIOError as exc:
            log.warning("%s", exc)
            return True

    def _beat(self) -> bool:
        """One conditional refresh; False when the lock is not (or no longer) this run's; S3 trouble raises."""
        with self._mutex:
            if self._etag is None or self.lost:
                return False
            etag = self._put("refreshing", IfMatch=self._etag)
            if etag is None:
                etag = self._own_etag()  # a retried beat meets the ETag its lost answer carried
            if etag is None:
                self.lost = True
                log.error("the %s lock at %s was taken over by another run", self.step, self.path)
                return False
            self._etag = etag
            return True

    def _own_etag(self) -> str | None:
        """The lock's ETag when it still names this run (no other run writes our run id), else None."""
        current = self._read()
        if current is None or current[0].get("run_id") != self.run_id:
            return None
        return current[1]

    def still_held(self) -> bool:
        """Whether this run still holds the lock, asked of S3 now (a beat): False once it was taken over. S3
        trouble raises :class:`RetryableIOError`: a commit that cannot tell does not go ahead."""
        return self._beat()

    def release(self) -> None:
        """Stop the heartbeat and delete the lock if this run still holds it. Never raises: a lock that cannot
        be deleted is logged and goes stale."""
        if self._heartbeat is not None:
            self._heartbeat.stop()
            self._heartbeat = None
        with self._mutex:
            etag, self._etag = self._etag, None
            if etag is None or self.lost:
                return
            client = self.client
            client_error, botocore_error = _errors()
            try:
                client.delete_object(Bucket=self.bucket, Key=self.key, IfMatch=etag)
            except client_error as exc:
                if _code(exc) in CONDITION_FAILED | GONE:
                    return  # taken over meanwhile: not ours to delete
                self._left_behind(exc)
            except botocore_error as exc:
                self._left_behind(exc)

    def _left_behind(self, exc: Exception) -> None:
        """A lock that cannot be deleted does not fail the run that held it: it goes stale without heartbeats."""
        log.warning("%s; the lock goes stale after %.0f s", self._io_error("releasing", exc), self.stale_after)

    def __enter__(self) -> S3Lock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
