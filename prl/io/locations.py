"""Where data lives: local paths and ``s3://`` URIs, the filesystems that read them, the S3 endpoint of the
standard AWS environment, and the one resolved spelling of a location that locks are keyed by.

Credentials are never read here: every client takes them from the standard AWS chain (environment, profile,
instance role) itself.
"""

from __future__ import annotations

import os
from typing import Any

import pyarrow.fs as pafs

from prl.errors import UsageError

S3_SCHEME = "s3://"


def aws_endpoint() -> str | None:
    """The S3 endpoint URL from the standard environment (``AWS_ENDPOINT_URL_S3``, then ``AWS_ENDPOINT_URL``)."""
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


def aws_region() -> str | None:
    """The AWS region from the standard environment (``AWS_REGION``, then ``AWS_DEFAULT_REGION``)."""
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or None


def aws_max_retries() -> int | None:
    """Retries after a failed S3 request from the standard ``AWS_MAX_ATTEMPTS`` (attempts, the first included, as
    boto3 reads it): attempts − 1, or None when it is unset (each client's own default). A value that is not a
    whole number ≥ 1 is a :class:`~prl.errors.UsageError`."""
    raw = os.environ.get("AWS_MAX_ATTEMPTS", "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise UsageError(f"AWS_MAX_ATTEMPTS must be a whole number of attempts >= 1, not {raw!r}")
    return int(raw) - 1


def is_remote(uri: str) -> bool:
    """Whether ``uri`` names an object store (``scheme://``) rather than a local path (``file://`` is local)."""
    return "://" in uri and not uri.startswith("file://")


def split_s3(uri: str) -> tuple[str, str]:
    """``(bucket, prefix)`` of an ``s3://`` URI, the prefix without empty segments: ``s3://b//a///c/`` →
    ``("b", "a/c")``. Object stores' path types (delta-rs, pyarrow) drop empty segments the same way, so both
    spellings name the same objects."""
    bucket, _, prefix = uri[len(S3_SCHEME) :].partition("/")
    return bucket, "/".join(part for part in prefix.split("/") if part)


def normalise_s3(uri: str) -> str:
    """The canonical spelling of an ``s3://`` URI: ``s3://bucket`` or ``s3://bucket/a/b`` (no empty segment,
    no trailing slash)."""
    bucket, prefix = split_s3(uri)
    return f"{S3_SCHEME}{bucket}/{prefix}" if prefix else f"{S3_SCHEME}{bucket}"


def resolved_location(uri: str) -> str:
    """One spelling per place: the real path of a local folder or file (symlinks, ``..``, ``a//b`` and a
    trailing slash resolved; ``file://`` dropped) or the normalised ``s3://bucket/prefix``. Two spellings of one
    store or output folder resolve to the same string, which is what locks are keyed by."""
    if uri.startswith(S3_SCHEME):
        return normalise_s3(uri)
    return os.path.realpath(uri.removeprefix("file://"))


def filesystem_for(uri: str) -> tuple[pafs.FileSystem, str]:
    """A pyarrow filesystem and the path inside it for a local path or an ``s3://`` URI."""
    if uri.startswith(S3_SCHEME):
        endpoint = aws_endpoint()
        kwargs: dict[str, Any] = {}
        if endpoint:
            scheme, _, host = endpoint.partition("://")
            # userinfo means nothing to S3 (requests are signed) and the AWS SDK would read the user as the host
            kwargs["endpoint_override"] = host.rpartition("@")[2].rstrip("/")
            kwargs["scheme"] = scheme
        region = aws_region()
        if region:
            kwargs["region"] = region
        return pafs.S3FileSystem(**kwargs), uri[len(S3_SCHEME) :].rstrip("/")
    if uri.startswith("file://"):
        uri = uri[len("file://") :]
    return pafs.LocalFileSystem(), os.path.abspath(uri)
