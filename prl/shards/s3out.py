"""Shard sets in an ``s3://`` OUT: the layout of :mod:`prl.shards.layout` under a prefix, published by uploads
that end with one conditional put (docs/design.md).

A build into ``s3://bucket/prefix`` stages its set in a local folder (``$TMPDIR/prl-s3out-<digest of OUT>``,
which the next build into that OUT on this host clears of what killed builds left) exactly as a local build does,
then :meth:`S3Out.publish`:

1. uploads every part to ``OUT/<set-id>/part-*.parquet`` and the sample ids to
   ``.OUT.prl/sets/<set-id>/sample_ids.arrow``, each with its sha256 as object metadata (``x-amz-meta-sha256``);
   a part already there with that sha256 and size (left by a cut upload of the same set) is not sent again;
2. checks that the build still holds its lock, then puts ``.OUT.prl/sets/<set-id>/manifest.json`` with
   ``If-None-Match: *``, the same S3 conditional write the store's locks use (:mod:`prl.store.s3lock`): the commit.
   A reader that sees the manifest sees every part it names. A manifest already there with the same bytes is the
   same set, already published; one with other bytes means another run published that set, exit 3;
3. puts ``.OUT.prl/index.json`` (after a rebuild has retired the sets it replaces), made before the uploads
   (:meth:`S3Out.next_index`) so that an unreadable manifest stops the build before it publishes: the lines of
   sets already in it are kept, and only the manifests of the others are read
   (:func:`prl.shards.index.updated_index`; normally none: the one just published is in hand), plus one that
   places the new line.

A set is complete when its manifest exists, so an upload killed at any point leaves no visible set: listing,
verify, loaders and later builds skip it and its samples count as not shipped. The next build removes what such
uploads left (:meth:`S3Out.clean`: set folders and meta folders without a manifest) and, from the same inputs,
builds the same set id and bytes again. A glob over ``OUT/*/part-*.parquet`` on S3 can see the parts of an upload in
progress (S3 has no folder rename): list the current files with ``prl shards list OUT``.

Credentials and endpoint come from the standard AWS environment (``AWS_ACCESS_KEY_ID`` …, profiles, instance roles;
``AWS_ENDPOINT_URL[_S3]``, ``AWS_REGION``) through boto3, as for the store; they are never printed.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import tempfile
import uuid
from collections.abc import Callable, Collection, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from prl.errors import LockedError, RetryableIOError, UsageError
from prl.io.locations import S3_SCHEME, normalise_s3, split_s3
from prl.shards.index import index_after_publish, mended_index
from prl.shards.layout import (
    INDEX,
    MANIFEST,
    MARKER,
    META,
    OLD_LAYOUT,
    OUT_FORMAT,
    SAMPLES_FILE,
    SET_ID_RE,
    SetRef,
    meta_dir,
    meta_name,
    meta_root,
)
from prl.shards.manifest import FileEntry, Manifest, ManifestError
from prl.shards.publish import Staging, clean_stale_staging, discard_staging, make_staging
from prl.shards.writer import read_ipc
from prl.store.s3lock import CONDITION_FAILED, shared_s3_client

try:
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError
except ImportError:  # pragma: no cover - depends on the installation
    boto3 = None

UPLOAD_THREADS = 4
"""Parts uploaded side by side (each upload is mostly waiting on the network)."""
SHA256_META = "sha256"
NO_BUCKET = {"NoSuchBucket"}


def _code(exc: ClientError) -> str:
    error = exc.response.get("Error", {})
    status = str(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
    code = str(error.get("Code", ""))
    return code if code and not code.isdigit() else status or code


def _marker(body: bytes | None) -> dict[str, Any] | None:
    """An OUT marker's JSON (``{"format", "out_id"}``), None when missing or not such an object."""
    try:
        obj = None if body is None else json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("out_id"), str) or not isinstance(obj.get("format"), int):
        return None
    return obj


class S3Out:
    """An ``s3://bucket/prefix`` OUT: its sets (complete once their manifest exists), their publication and
    their removal. ``uri`` is normalised (no empty segment, no trailing slash)."""

    def __init__(self, uri: str) -> None:
        if boto3 is None:  # pragma: no cover - depends on the installation
            raise UsageError("an s3:// OUT needs boto3: pip install 'prl[s3]'")
        self.uri = normalise_s3(uri)
        self.bucket, prefix = split_s3(self.uri)
        self.prefix = f"{prefix}/" if prefix else ""
        parent, _, name = prefix.rpartition("/")
        self.meta_prefix = f"{parent}/{meta_name(name)}" if parent else meta_name(name) if name else ""
        """The meta folder's prefix, beside OUT's (``a/.out.prl`` for ``a/out``): no reader of OUT lists it."""
        self._client: Any = None
        self._manifests: dict[str, tuple[str, Manifest]] = {}
        """The manifests read, by set id, with the ETag each was read at."""

    # --- keys and access -----------------------------------------------------------------------------------
    def key(self, *parts: str) -> str:
        return self.prefix + "/".join(parts)

    def mkey(self, *parts: str) -> str:
        """A key in the meta folder beside OUT (an OUT at a bucket's root has none: a usage error)."""
        if not self.meta_prefix:
            raise UsageError(f"shard output {self.uri}: an s3:// OUT needs a prefix (s3://bucket/name), not a bucket")
        return "/".join([self.meta_prefix, *parts])

    def url(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    def meta_key(self, set_id: str, name: str) -> str:
        """``.OUT.prl/sets/<set-id>/<name>``."""
        return self.mkey("sets", set_id, name)

    def manifest_uri(self, set_id: str) -> str:
        return self.url(self.meta_key(set_id, MANIFEST))

    def set_uri(self, set_id: str) -> str:
        return self.url(self.key(set_id))

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = shared_s3_client()
        return self._client

    def _error(self, action: str, exc: Exception) -> Exception:
        """The prl error of a failed request: a missing bucket is a usage error (exit 2), the rest retryable."""
        if isinstance(exc, ClientError) and _code(exc) in NO_BUCKET:
            return UsageError(f"shard output {self.uri}: bucket {self.bucket!r} does not exist")
        return RetryableIOError(f"{action} shard output {self.uri} failed: {exc}")

    def check(self, store_uri: str = "") -> None:
        """Refuse an OUT this process cannot use before anything is built: no credentials in the standard AWS
        environment (exit 2), a missing bucket (exit 2), an endpoint that cannot be reached (exit 5), and what
        :meth:`check_out` refuses (exit 2)."""
        self._check_access()
        self.check_out(store_uri)

    def _check_access(self) -> None:
        if boto3.session.Session().get_credentials() is None:
            raise UsageError(
                f"shard output {self.uri}: no AWS credentials in the environment (set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or run with an instance role; AWS_ENDPOINT_URL names a "
                "non-AWS endpoint)"
            )
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except ClientError as exc:
            if _code(exc) in NO_BUCKET | {"404"}:
                raise UsageError(f"shard output {self.uri}: bucket {self.bucket!r} does not exist") from None
            raise self._error("reaching", exc) from exc
        except BotoCoreError as exc:
            raise self._error("reaching", exc) from exc

    def check_out(self, store_uri: str) -> None:
        """Refuse (exit 2) an OUT inside the store or holding it (``s3://`` URIs compared normalised), an OUT of
        an earlier prl layout, and a prefix that holds objects but is no prl OUT (no ``.prl/out.json``)."""
        if store_uri.startswith(S3_SCHEME):
            store = normalise_s3(store_uri)
            if self.uri == store or self.uri.startswith(f"{store}/"):
                raise UsageError(f"shard output {self.uri} is inside the store {store}: choose a prefix outside it")
            if store.startswith(f"{self.uri}/"):
                raise UsageError(f"shard output {self.uri} holds the store {store}: choose a prefix outside it")
        body = self.read_unless_missing(self.mkey(MARKER))
        marker = _marker(body)
        if marker is not None and marker["format"] == OUT_FORMAT:
            return
        keys = [obj["Key"] for obj in itertools.islice(self._keys(self.prefix), 1000)]
        if body is not None or any(k.startswith(self.key(META) + "/") for k in keys):
            raise UsageError(
                OLD_LAYOUT.format(out=self.uri, META=self.url(self.meta_prefix), MARKER=MARKER, FORMAT=OUT_FORMAT)
            )
        if keys:
            raise UsageError(
                f"shard output {self.uri} holds objects and is no prl shard output (no "
                f"{self.url(self.mkey(MARKER))}): build into an empty or new prefix"
            )

    def lock_step(self) -> str:
        """The build lock's step, ``build-shards-<digest of the normalised URI>`` (an S3 prefix has one spelling
        once normalised), after putting the OUT's marker when it has none (``If-None-Match: *``)."""
        key = self.mkey(MARKER)
        body = json.dumps({"format": OUT_FORMAT, "out_id": uuid.uuid4().hex}).encode()
        try:
            self.client.put_object(Bucket=self.bucket, Key=key, Body=body, IfNoneMatch="*")
        except ClientError as exc:
            if _code(exc) not in CONDITION_FAILED:
                raise self._error("writing", exc) from exc
        except BotoCoreError as exc:
            raise self._error("writing", exc) from exc
        return f"build-shards-{hashlib.sha256(self.uri.encode()).hexdigest()[:12]}"

    def _keys(self, prefix: str) -> Iterator[dict[str, Any]]:
        """Every object under ``prefix`` (``Key``, ``Size``)."""
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
            for page in pages:
                yield from page.get("Contents", [])
        except (ClientError, BotoCoreError) as exc:
            raise self._error("listing", exc) from exc

    def _folders(self, prefix: str) -> list[str]:
        """The names of the "folders" directly under ``prefix`` (common prefixes, without the slash)."""
        names: list[str] = []
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=prefix, Delimiter="/"
            )
            for page in pages:
                names += [p["Prefix"][len(prefix) :].rstrip("/") for p in page.get("CommonPrefixes", [])]
        except (ClientError, BotoCoreError) as exc:
            raise self._error("listing", exc) from exc
        return names

    def read(self, key: str) -> bytes:
        try:
            return bytes(self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read())
        except (ClientError, BotoCoreError) as exc:
            raise self._error("reading", exc) from exc

    def read_unless_missing(self, key: str) -> bytes | None:
        """The body of ``key`` in one GET, None when there is no such key; any other failed request is a
        :class:`~prl.errors.RetryableIOError`."""
        try:
            return bytes(self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read())
        except ClientError as exc:
            if _code(exc) not in {"404", "NoSuchKey", "NotFound"}:
                raise self._error("reading", exc) from exc
            return None
        except BotoCoreError as exc:
            raise self._error("reading", exc) from exc

    def read_if_any(self, key: str) -> bytes | None:
        """The body of ``key`` in one GET, or None when it cannot be read (missing, or any failed request): for
        derived data (the index, the frontier) that is made again when absent."""
        try:
            return bytes(self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read())
        except (ClientError, BotoCoreError):
            return None

    def _delete(self, keys: list[str]) -> None:
        for start in range(0, len(keys), 1000):
            batch = [{"Key": k} for k in keys[start : start + 1000]]
            try:
                self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})
            except (ClientError, BotoCoreError) as exc:
                raise self._error("deleting from", exc) from exc

    # --- reading sets --------------------------------------------------------------------------------------
    def _listed_manifests(self) -> dict[str, str]:
        """The complete sets (those whose manifest exists): set id → the manifest's ETag."""
        meta = self.mkey("sets") + "/"
        return {
            obj["Key"][len(meta) :].split("/")[0]: str(obj.get("ETag", ""))
            for obj in self._keys(meta)
            if obj["Key"].endswith(f"/{MANIFEST}") and obj["Key"][len(meta) :].count("/") == 1
        }

    def set_ids(self) -> list[str]:
        """Ids of the complete sets (those whose manifest exists), sorted."""
        return sorted(self._listed_manifests())

    def ref(self, set_id: str) -> SetRef:
        return SetRef(
            self.uri,
            set_id,
            self.set_uri(set_id),
            self.manifest_uri(set_id),
            self.url(self.meta_key(set_id, SAMPLES_FILE)),
        )

    def refs(self) -> list[SetRef]:
        return [self.ref(set_id) for set_id in self.set_ids()]

    def manifest(self, set_id: str, etag: str = "") -> Manifest:
        """The manifest of set ``set_id``; :class:`ManifestError` when it is not valid. With ``etag`` (the
        manifest's, as a listing just gave it) a manifest this object already read with that ETag is not read
        again: an ETag names the object's content."""
        kept = self._manifests.get(set_id)
        if etag and kept is not None and kept[0] == etag:
            return kept[1]
        where = self.manifest_uri(set_id)
        try:
            answer = self.client.get_object(Bucket=self.bucket, Key=self.meta_key(set_id, MANIFEST))
            body = answer["Body"].read()
        except (ClientError, BotoCoreError) as exc:
            raise self._error("reading", exc) from exc
        try:
            obj = json.loads(body)
        except ValueError as exc:
            raise ManifestError(f"{where}: not JSON: {exc}") from None
        manifest = Manifest.from_json(obj, where)
        self._manifests[set_id] = (str(answer.get("ETag", "")), manifest)
        return manifest

    def existing_sets(self) -> list[Manifest]:
        """Manifests of the complete sets, by set id (each read once per this object and manifest content: a
        reader that lists them twice reads each once). A build needs only :meth:`set_ids`."""
        return [self.manifest(set_id, etag) for set_id, etag in sorted(self._listed_manifests().items())]

    def shipped_ids(self, prior: list[str]) -> pa.Array | None:
        """The sample ids the sets ``prior`` (ids) shipped (one Arrow string array; None when there are none)."""
        columns = []
        for set_id in prior:
            data = self.read(self.meta_key(set_id, SAMPLES_FILE))
            column = read_ipc(pa.py_buffer(data), columns=["sample_id"]).column("sample_id")
            columns.append(column.combine_chunks().cast(pa.string()))
        columns = [c for c in columns if len(c)]
        return pa.concat_arrays(columns) if columns else None

    def resolve(self) -> list[SetRef]:
        """The sets this URI names: the one set when it is ``OUT/<set-id>`` of a complete set, else every
        complete set of the OUT. Raises :class:`UsageError` when it holds none and is no OUT prl wrote."""
        parent, _, name = self.uri.rpartition("/")
        if SET_ID_RE.fullmatch(name) and parent.count("/") >= 2:
            own = S3Out(parent)
            if name in own.set_ids():
                return [own.ref(name)]
        refs = self.refs()
        if refs or any(True for _ in self._keys(self.mkey() + "/")):
            return refs
        raise UsageError(f"{self.uri} holds no shard set (no {self.url(self.mkey('sets'))}/<set-id>/{MANIFEST})")

    def download_set(self, set_id: str, local_out: str) -> None:
        """Copy set ``set_id`` (every object of its folder and of its meta folder) into the local OUT
        ``local_out``, in the same layout."""
        for prefix, folder in (
            (self.key(set_id) + "/", os.path.join(local_out, set_id)),
            (self.mkey("sets", set_id) + "/", meta_dir(local_out, set_id)),
        ):
            os.makedirs(folder, exist_ok=True)
            for obj in self._keys(prefix):
                name = obj["Key"][len(prefix) :]
                if "/" in name or not name:
                    continue
                try:
                    self.client.download_file(self.bucket, obj["Key"], os.path.join(folder, name))
                except (ClientError, BotoCoreError) as exc:
                    raise self._error("reading", exc) from exc

    # --- writing -------------------------------------------------------------------------------------------
    @property
    def local_root(self) -> str:
        """Where builds into this OUT stage their sets on this host: ``$TMPDIR/prl-s3out-<12 hex digits of the
        OUT's URI>/out``, laid out as a local OUT (its meta folder beside it holds the staging folders, named by
        set id, pid and nonce)."""
        digest = hashlib.sha256(self.uri.encode()).hexdigest()[:12]
        return os.path.join(tempfile.gettempdir(), f"prl-s3out-{digest}", "out")

    def stage(self, set_id: str) -> Staging:
        """A local staging folder for ``set_id`` under :attr:`local_root`."""
        return make_staging(self.local_root, set_id)

    def discard(self, staging: Staging, nothing_shipped: bool = False) -> None:
        """Remove the local folder :meth:`stage` made (and :attr:`local_root` when nothing else is left)."""
        discard_staging(staging, self.local_root)
        for folder in (meta_root(self.local_root), self.local_root, os.path.dirname(self.local_root)):
            with contextlib.suppress(OSError):
                os.rmdir(folder)

    def clean(self, keep: str | None) -> None:
        """Remove what killed uploads left (call it holding the build lock): set folders and meta folders of
        set ids without a manifest, except set ``keep`` (the set this build makes: its parts already sent are
        not sent again); and on this host the local staging folders of killed builds into this OUT (their pid
        is gone, :func:`prl.shards.publish.clean_stale_staging`)."""
        if os.path.isdir(os.path.dirname(self.local_root)):
            clean_stale_staging(self.local_root)
        complete = {*self.set_ids(), keep}
        keys: list[str] = []
        for root in (self.prefix, self.mkey("sets") + "/"):
            for name in self._folders(root):
                if SET_ID_RE.fullmatch(name) and name not in complete:
                    keys += [obj["Key"] for obj in self._keys(f"{root}{name}/")]
        self._delete(keys)

    def _upload(self, path: str, key: str, entry: FileEntry) -> bool:
        """Upload ``path`` to ``key`` with its sha256 as metadata, unless that very file is there already;
        True when it was sent."""
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=key)
            if head.get("ContentLength") == entry.bytes and head.get("Metadata", {}).get(SHA256_META) == entry.sha256:
                return False
        except ClientError as exc:
            if _code(exc) not in {"404", "NoSuchKey", "NotFound"}:
                raise self._error("writing", exc) from exc
        except BotoCoreError as exc:
            raise self._error("writing", exc) from exc
        try:
            self.client.upload_file(path, self.bucket, key, ExtraArgs={"Metadata": {SHA256_META: entry.sha256}})
        except (ClientError, BotoCoreError, OSError) as exc:
            raise self._error("writing", exc) from exc
        return True

    def publish(self, staging: Staging, set_id: str, check_lock: Callable[[], None]) -> str:
        """Upload the complete ``staging`` as set ``set_id``: parts and sample ids, then (``check_lock()``
        first) the manifest with ``If-None-Match: *``; returns the set's URI. The staging folder is removed. The
        index is the caller's to write (:meth:`next_index`, :meth:`write_index`)."""
        manifest_file = os.path.join(staging.meta, MANIFEST)
        with open(manifest_file, "rb") as fh:
            body = fh.read()
        manifest = Manifest.from_json(json.loads(body), manifest_file)
        jobs = [(os.path.join(staging.parts, e.file), self.key(set_id, e.file), e) for e in manifest.shards]
        jobs.append((os.path.join(staging.meta, SAMPLES_FILE), self.meta_key(set_id, SAMPLES_FILE), manifest.samples))
        check_lock()  # before the uploads (a lost lock sends nothing) and again before the commit
        with ThreadPoolExecutor(max_workers=UPLOAD_THREADS) as pool:
            list(pool.map(lambda job: self._upload(*job), jobs))
        check_lock()
        self._put_manifest(set_id, body)
        self.discard(staging)
        return self.set_uri(set_id)

    def _put_manifest(self, set_id: str, body: bytes) -> None:
        """The commit: create the manifest only where none exists (an identical one is this set, published)."""
        key = self.meta_key(set_id, MANIFEST)
        try:
            self.client.put_object(
                Bucket=self.bucket, Key=key, Body=body, ContentType="application/json", IfNoneMatch="*"
            )
        except ClientError as exc:
            if _code(exc) not in CONDITION_FAILED:
                raise self._error("writing", exc) from exc
            if self.read(key) != body:
                raise LockedError(
                    f"set {set_id} was published in {self.uri} by another run meanwhile (its manifest differs)"
                ) from None
        except BotoCoreError as exc:
            raise self._error("writing", exc) from exc

    def retire(self, set_ids: list[str]) -> None:
        """Remove the sets ``set_ids`` (those a rebuild replaced): each manifest first (the set is gone at
        once), then its parts and sample ids."""
        for set_id in set_ids:
            self._delete([self.meta_key(set_id, MANIFEST)])
            self._delete([obj["Key"] for obj in self._keys(self.key(set_id) + "/")])
            self._delete([obj["Key"] for obj in self._keys(self.mkey("sets", set_id) + "/")])

    def put(self, key: str, body: bytes) -> None:
        """Put one object of derived data (the index, the frontier: the last writer wins)."""
        try:
            self.client.put_object(Bucket=self.bucket, Key=key, Body=body)
        except (ClientError, BotoCoreError) as exc:
            raise self._error("writing", exc) from exc

    def delete_under(self, prefix: str, keep: str) -> None:
        """Delete every object under ``prefix`` except ``keep`` (with boto3: pyarrow's S3 filesystem leaves a
        folder marker object where it deletes)."""
        self._delete([obj["Key"] for obj in self._keys(prefix) if obj["Key"] != keep])

    def next_index(self, manifest: Manifest, replaced: Collection[str] = ()) -> dict[str, Any]:
        """The ``.OUT.prl/index.json`` object once ``manifest``'s set is published and the sets ``replaced`` are
        retired (:func:`prl.shards.index.index_after_publish`), made before the set is published."""
        listed = self._listed_manifests()
        raw = self.read_if_any(self.mkey(INDEX))
        return index_after_publish(
            raw, listed, manifest, lambda set_id: self.manifest(set_id, listed[set_id]), replaced
        )

    def refresh_index(self) -> bool:
        """Put ``.OUT.prl/index.json`` again when it is not the index of the sets listed now (a build killed
        between publishing its manifest and putting the index leaves it one set behind); reads only the manifests
        of listed sets missing from it. Returns whether it was put (never when OUT holds no set and no index)."""
        listed = self._listed_manifests()
        raw = self.read_unless_missing(self.mkey(INDEX))  # a failed read is no reason to read every manifest
        index = mended_index(raw, listed, lambda set_id: self.manifest(set_id, listed[set_id]))
        if index is None:
            return False
        self.write_index(index)
        return True

    def write_index(self, index: dict[str, Any]) -> None:
        """Put ``index`` (:meth:`next_index`) as ``.OUT.prl/index.json`` (derived data: the last writer wins)."""
        data = (json.dumps(index, indent=2, sort_keys=True) + "\n").encode()
        try:
            self.client.put_object(Bucket=self.bucket, Key=self.mkey(INDEX), Body=data, ContentType="application/json")
        except (ClientError, BotoCoreError) as exc:
            raise self._error("writing", exc) from exc


__all__ = ["S3Out"]
