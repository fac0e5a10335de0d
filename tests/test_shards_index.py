"""``OUT/.prl/index.json`` kept up to date from the index there and the set ids listed
(:func:`prl.shards.index.updated_index`): always the index of every listed manifest, line for line, while the
manifests read are only those of sets missing from it and the few that place them; and local builds that read
one old manifest whatever OUT holds and leave exactly that index after a rebuild, a removed set, a build killed
between its manifest and its index, and a missing or garbage index."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

import prl.shards.target
from prl.cli import app
from prl.schema import SCHEMA_VERSION
from prl.shards.build import build_shards
from prl.shards.index import index_json, updated_index
from prl.shards.layout import find_sets, index_path, meta_dir, meta_root
from prl.shards.manifest import SAMPLES_FILE, FileEntry, Manifest, ManifestError, Totals, existing_sets
from prl.shards.options import ShardOptions
from prl.store.tables import Store
from tests.shards_fixtures import commit_group


def manifest(n: int, excluded: int) -> Manifest:
    """Set ``n`` (traces version n) built when ``excluded`` sets were there, with ``n % 3 + 1`` parts."""
    shards = [FileEntry(f"part-{p:05d}.parquet", 2, 100 + p, f"{p:02x}" * 32, 1, 10, 6) for p in range(n % 3 + 1)]
    return Manifest(
        set_id=f"v{n}-{n:012x}",
        schema_version=SCHEMA_VERSION,
        columns=["sample_id"],
        options={},
        options_sha256="ab" * 32,
        source_versions={"traces": n, "rewards": n, "ref_logprobs": None},
        current_version=None,
        excluded_sets=[f"x{i}" for i in range(excluded)],
        shuffle={},
        shards=shards,
        samples=FileEntry(SAMPLES_FILE, 2 * len(shards), 50, "cd" * 32),
        totals=Totals(rows=2 * len(shards), groups=len(shards), tokens=10 * len(shards), completion_tokens=6, shards=1),
        heads={},
        statistics={},
        drops={},
        conventions={},
    )


def as_bytes(obj: dict) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()


def reader(manifests: list[Manifest]):
    """``updated_index``'s manifest callback over ``manifests``, and the list of ids it was asked for."""
    by_id = {m.set_id: m for m in manifests}
    asked: list[str] = []

    def read(set_id: str) -> Manifest:
        asked.append(set_id)
        return by_id[set_id]

    return read, asked


CHAIN = [manifest(n, n - 1) for n in range(1, 9)]
"""Eight sets, each built over all the earlier ones: v1 excluded none, v8 seven."""
IDS = [m.set_id for m in CHAIN]


def test_a_new_set_that_goes_last_reads_its_manifest_and_the_last_lines():
    read, asked = reader(CHAIN)
    index = updated_index(as_bytes(index_json(CHAIN[:7])), IDS, read)
    assert as_bytes(index) == as_bytes(index_json(CHAIN))
    assert asked == [IDS[7], IDS[6]]


def test_a_new_set_that_does_not_go_last_is_placed_by_bisection():
    """Sets removed by hand: a new set over three sets goes after v4 (three excluded too, a smaller id)."""
    late = manifest(9, 3)
    read, asked = reader([*CHAIN, late])
    index = updated_index(as_bytes(index_json(CHAIN)), [*IDS, late.set_id], read)
    assert [line["set_id"] for line in index["sets"]] == [*IDS[:4], late.set_id, *IDS[4:]]
    assert as_bytes(index) == as_bytes(index_json([*CHAIN, late]))
    assert asked == [late.set_id, IDS[7], IDS[3], IDS[5], IDS[4]]


def test_two_sets_missing_from_the_index_are_both_added():
    """A build killed between its manifest and its index: the next one adds both lines."""
    read, asked = reader(CHAIN)
    index = updated_index(as_bytes(index_json(CHAIN[:6])), IDS, read)
    assert as_bytes(index) == as_bytes(index_json(CHAIN))
    assert asked == [IDS[6], IDS[7], IDS[5]]


def test_lines_of_sets_no_longer_listed_are_dropped_reading_nothing():
    read, asked = reader(CHAIN)
    kept = [m for m in CHAIN if m.set_id not in (IDS[0], IDS[4])]
    index = updated_index(as_bytes(index_json(CHAIN)), [m.set_id for m in kept], read)
    assert as_bytes(index) == as_bytes(index_json(kept))
    assert asked == []


def _line(**changes) -> bytes:
    obj = index_json(CHAIN[:7])
    obj["sets"][2] = {**obj["sets"][2], **changes}
    return as_bytes(obj)


NO_HELP = {
    "missing": None,
    "empty": b"",
    "not JSON": b'{"schema_version": ',
    "a list": b"[]",
    "no sets": as_bytes({"schema_version": SCHEMA_VERSION}),
    "another schema version": as_bytes({**index_json(CHAIN[:7]), "schema_version": "0"}),
    "rows not a number": _line(rows="2"),
    "a key missing": as_bytes(
        {
            "schema_version": SCHEMA_VERSION,
            "sets": [{k: v for k, v in index_json(CHAIN[:1])["sets"][0].items() if k != "files"}],
        }
    ),
    "a key more": _line(extra=1),
    "a file of another set": _line(files=["v0-000000000000/part-00000.parquet"]),
    "a version not a number": _line(source_versions={"traces": "3"}),
    "a set twice": as_bytes({"schema_version": SCHEMA_VERSION, "sets": index_json(CHAIN[:2])["sets"] * 2}),
}


@pytest.mark.parametrize("raw", NO_HELP.values(), ids=NO_HELP.keys())
def test_an_index_that_is_no_help_means_every_manifest_is_read(raw):
    read, asked = reader(CHAIN)
    index = updated_index(raw, IDS, read)
    assert as_bytes(index) == as_bytes(index_json(CHAIN))
    assert asked == IDS


OPTIONS = ShardOptions(target_tokens=400, seed=1)


def _expected(out: str) -> bytes:
    """The index of every manifest in ``out``, as a build writes it."""
    return as_bytes(index_json(existing_sets(out)))


def test_local_builds_read_one_old_manifest_and_leave_the_index_of_every_manifest(tmp_path, monkeypatch):
    store, out = Store(str(tmp_path / "store")), str(tmp_path / "out")
    read: list[str] = []
    real = Manifest.read_file.__func__  # type: ignore[attr-defined]

    def counting(cls, path):
        read.append(os.path.relpath(path, out))
        return real(cls, path)

    monkeypatch.setattr(Manifest, "read_file", classmethod(counting))

    def build(name: str, **kwargs) -> tuple[str, list[str]]:
        """Build group ``name``: the set id and the manifests the build read."""
        commit_group(store, name)
        read.clear()
        result = build_shards(store, out, options=OPTIONS, **kwargs)
        seen = list(read)
        assert result.status == "built"
        assert Path(index_path(out)).read_bytes() == _expected(out)
        return result.set_id, seen

    def meta(set_id: str) -> str:
        return os.path.relpath(os.path.join(meta_dir(out, set_id), "manifest.json"), out)

    sets = [build("a")[0]]
    for name in "bcde":
        set_id, seen = build(name)
        assert seen == [meta(sets[-1])]  # the last line's only (the new set's is in hand), at 1 to 4 sets
        sets.append(set_id)

    for gone in sets[1:3]:  # two sets removed by hand: the next set goes before the last one
        shutil.rmtree(os.path.join(out, gone))
        shutil.rmtree(meta_dir(out, gone))
    late, seen = build("f")
    order = [line["set_id"] for line in json.loads(Path(index_path(out)).read_text())["sets"]]
    assert order.index(late) == 2 and len(order) == 4
    assert seen[0] == meta(sets[-1]) and len(seen) >= 2  # the last line's, then the bisection's

    Path(index_path(out)).write_text("{garbage")
    listed = sorted([sets[0], *sets[3:], late])
    garbage_id, seen = build("g")
    assert seen == [meta(s) for s in sorted(listed)]  # no help: every other manifest, once
    os.remove(index_path(out))
    missing_id, seen = build("h")
    assert seen == [meta(s) for s in sorted([*listed, garbage_id])]

    def killed(out_: str, index: dict) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as patched:  # a build killed between its manifest and its index
        patched.setattr(prl.shards.target, "write_index", killed)
        commit_group(store, "i")
        with pytest.raises(KeyboardInterrupt):
            build_shards(store, out, options=OPTIONS)
    assert Path(index_path(out)).read_bytes() != _expected(out)
    (killed_id,) = {ref.set_id for ref in find_sets(out)} - {*listed, garbage_id, missing_id}
    _, seen = build("j")
    assert seen == [meta(killed_id), meta(missing_id)]  # the set missing from the index, then the last line
    rebuilt, _ = build("k", rebuild=True)
    assert [line["set_id"] for line in json.loads(_expected(out))["sets"]] == [rebuilt]


def _one_set_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Store, str]:
    """A store and an OUT of two sets whose index holds the first alone: the second build was killed between
    publishing its set and writing the index."""
    store, out = Store(str(tmp_path / "store")), str(tmp_path / "out")
    commit_group(store, "a")
    build_shards(store, out, options=OPTIONS)
    commit_group(store, "b")
    with monkeypatch.context() as patched:
        patched.setattr(prl.shards.target, "write_index", lambda out_, index: (_ for _ in ()).throw(KeyboardInterrupt))
        with pytest.raises(KeyboardInterrupt):
            build_shards(store, out, options=OPTIONS)
    return store, out


def test_a_build_with_nothing_new_mends_an_index_left_one_set_behind(tmp_path, monkeypatch):
    """A build killed between publishing its set and writing the index leaves the index one set behind; the next
    build, though it ships nothing, writes the index of every manifest, reading only the missing set's manifest
    (and the last line's, which places it), and a build after that, with the index right, leaves the file as it is."""
    store, out = _one_set_behind(tmp_path, monkeypatch)
    (first, second) = sorted(find_sets(out), key=lambda ref: ref.set_id)
    before = Path(index_path(out)).read_bytes()
    assert before != _expected(out)
    read: list[str] = []
    real = Manifest.read_file.__func__  # type: ignore[attr-defined]
    monkeypatch.setattr(Manifest, "read_file", classmethod(lambda cls, path: (read.append(path), real(cls, path))[1]))
    assert build_shards(store, out, options=OPTIONS).status == "nothing_new"
    assert Path(index_path(out)).read_bytes() == _expected(out)
    indexed = {line["set_id"] for line in json.loads(Path(index_path(out)).read_text())["sets"]}
    assert indexed == {first.set_id, second.set_id}
    killed = next(iter(indexed - {line["set_id"] for line in json.loads(before)["sets"]}))
    # the missing set's manifest and the last line's (which places it), nothing else
    assert read and {os.path.basename(os.path.dirname(path)) for path in read} == {killed, first.set_id}
    written = os.stat(index_path(out))
    read.clear()
    assert build_shards(store, out, options=OPTIONS).status == "nothing_new"
    again = os.stat(index_path(out))  # the index is written to a new file renamed over it: a new inode
    assert (again.st_ino, again.st_mtime_ns) == (written.st_ino, written.st_mtime_ns) and read == []


def test_an_index_that_cannot_be_mended_does_not_fail_a_build_with_nothing_new(tmp_path, monkeypatch):
    """The set missing from the index has a manifest cut short: the build that ships nothing cannot mend the
    index, leaves it as it was and still ends ``nothing_new`` (the index is derived data; `prl verify` reports
    both)."""
    store, out = _one_set_behind(tmp_path, monkeypatch)
    killed = max(ref.set_id for ref in find_sets(out))
    manifest = Path(meta_dir(out, killed)) / "manifest.json"
    manifest.write_text(manifest.read_text()[:-20])
    index = Path(index_path(out)).read_bytes()
    assert build_shards(store, out, options=OPTIONS).status == "nothing_new"
    assert Path(index_path(out)).read_bytes() == index


def test_an_unreadable_manifest_of_out_stops_the_build_before_it_publishes(tmp_path):
    """The index is made before the set is published: a manifest it needs that cannot be read (here the last
    line's, which places the new line) fails the build with nothing published and the index as it was, where
    publishing first would leave a set outside the index, built again by every later run. A rebuild, which
    needs no manifest of the sets it replaces, retires that set and publishes."""
    store, out = Store(str(tmp_path / "store")), str(tmp_path / "out")
    sets = []
    for name in "ab":
        commit_group(store, name)
        sets.append(build_shards(store, out, options=OPTIONS).set_id)
    manifest = Path(meta_dir(out, sets[-1])) / "manifest.json"
    manifest.write_text(manifest.read_text()[:-20])  # cut short
    index = Path(index_path(out)).read_bytes()
    commit_group(store, "c")
    with pytest.raises(ManifestError, match=r"manifest\.json"):
        build_shards(store, out, options=OPTIONS)
    args = ["build-shards", "--store", store.uri, "--out", out, "--set", "target_tokens=400", "--set", "seed=1"]
    res = CliRunner().invoke(app, [*args, "--json"])  # and again, from the command line: exit 2, one object
    assert res.exit_code == 2 and res.stdout.count("\n") == 1
    summary = json.loads(res.stdout)
    assert summary["exit_code"] == 2 and f"{meta_dir(out, sets[-1])}/manifest.json: not JSON" in summary["error"]
    assert sorted(ref.set_id for ref in find_sets(out)) == sets
    assert Path(index_path(out)).read_bytes() == index
    assert not os.path.exists(os.path.join(meta_root(out), "staging"))  # the staged set went with the failure
    rebuilt = build_shards(store, out, options=OPTIONS, rebuild=True)
    assert [ref.set_id for ref in find_sets(out)] == [rebuilt.set_id]
    assert Path(index_path(out)).read_bytes() == _expected(out)
