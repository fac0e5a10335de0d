"""A real S3 API for tests: moto's server in its own process on 127.0.0.1 (:mod:`tests.moto_s3`, which hands S3
requests straight to moto's S3 app), one fresh bucket per test.

Import the fixtures in a test module that needs them::

    from tests.s3_server import moto_endpoint, s3  # noqa: F401

``moto_endpoint`` (session) starts the server on a free port and stops it at the end; ``s3`` (per test) points
the standard AWS environment at it (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID=testing``,
``AWS_SECRET_ACCESS_KEY=testing``, ``AWS_REGION=us-east-1``), creates a bucket and hands back an :class:`S3`.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"}
CLEARED = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"{url}/moto-api/", timeout=1):
                return True
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.1)
    return False


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    """Run moto's server (:mod:`tests.moto_s3`) on a free local port; yields its ``http://127.0.0.1:PORT`` URL."""
    with moto_process() as (url, _):
        yield url


@contextlib.contextmanager
def moto_process() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """:func:`moto_server`, yielding its URL and its process."""
    for _ in range(3):  # the free port can be taken between probing and binding: try another
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        proc = subprocess.Popen(
            [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "moto_s3.py"), str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            if _wait_ready(url, proc):
                yield url, proc
                return
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    raise RuntimeError("moto_server did not start")


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    with moto_server() as url:
        yield url


@dataclass
class S3:
    """A bucket on the test server, with a boto3 client."""

    endpoint: str
    bucket: str
    client: Any

    def url(self, key: str = "") -> str:
        return f"s3://{self.bucket}/{key}"

    def put(self, key: str, data: bytes) -> str:
        self.client.put_object(Bucket=self.bucket, Key=key, Body=data)
        return self.url(key)

    def keys(self, prefix: str = "") -> list[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return sorted(obj["Key"] for page in pages for obj in page.get("Contents", []))


def use_endpoint(monkeypatch: pytest.MonkeyPatch, endpoint: str) -> None:
    """Point the standard AWS environment (and nothing else) at ``endpoint`` for one test."""
    for name in CLEARED:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def s3(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> S3:
    import boto3

    use_endpoint(monkeypatch, moto_endpoint)
    client = boto3.client("s3", endpoint_url=moto_endpoint, region_name=CREDENTIALS["AWS_REGION"])
    bucket = f"prl-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)
    return S3(moto_endpoint, bucket, client)


def client_for(endpoint: str) -> Any:
    """A boto3 S3 client of the test server at ``endpoint``, with the test credentials (whatever the
    environment holds)."""
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=CREDENTIALS["AWS_REGION"],
        aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    )


def environ_for(endpoint: str) -> dict[str, str]:
    """The environment of a child process that talks to the test server."""
    env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    return {**env, **CREDENTIALS, "AWS_ENDPOINT_URL": endpoint}
