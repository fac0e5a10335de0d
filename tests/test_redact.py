"""Credentials are never kept nor printed (:mod:`prl.redact`): header values (``Authorization``, ``x-api-key``,
cookies…) in quarantined raw lines, at any depth of JSON in JSON strings and in lines cut short; URL userinfo in
every log line, at every verbosity; secrets of the environment wherever a library repeats them."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from hypothesis import assume, given
from hypothesis import strategies as st

from prl.ingestion.traces import ingest
from prl.redact import CREDENTIAL_NAMES, MASK, RedactingFormatter, redact, redact_urls
from prl.store.tables import Store
from tests.pipeline_helpers import prl_env
from tests.score_helpers import serving, write_traces

FIXTURE = Path(__file__).parent / "fixtures" / "envelopes" / "proxy_capture.jsonl"
SAFE = "Capital of France?"


@st.composite
def header_names(draw: st.DrawFn) -> str:
    name = draw(st.sampled_from(CREDENTIAL_NAMES))
    flips = draw(st.lists(st.booleans(), min_size=len(name), max_size=len(name)))
    spelled = "".join(c.upper() if up else c for c, up in zip(name, flips, strict=True))
    return spelled.replace("-", "_") if draw(st.booleans()) else spelled


secrets = st.builds(lambda body: f"Sk{body}", st.text(min_size=6, max_size=40))
line_secrets = st.builds(lambda body: f"Sk{body}", st.text(st.characters(exclude_characters="\r\n\"'"), min_size=6))


def nest(value: Any, levels: int) -> str:
    """``value`` as JSON, held ``levels`` times in a JSON string."""
    text = json.dumps(value)
    for _ in range(levels):
        text = json.dumps({"request": text})
    return text


@given(
    name=header_names(),
    secret=secrets,
    shape=st.sampled_from(["member", "pair", "line"]),
    levels=st.integers(0, 3),
)
def test_a_credential_value_never_survives_whatever_its_shape_and_depth(name, secret, shape, levels):
    if shape == "line":
        assume(not any(c in secret for c in "\r\n\"'"))
        headers: Any = f"POST /v1/chat/completions HTTP/1.1\r\n{name}: {secret}\r\ncontent-type: application/json"
    elif shape == "pair":
        headers = [["content-type", "application/json"], [name, secret]]
    else:
        headers = {"content-type": "application/json", name: secret}
    record = {"request": {"headers": headers, "body": {"messages": [{"role": "user", "content": SAFE}]}}}
    text = nest(record, levels)
    assume(secret not in text.replace(secret, ""))  # the secret is not part of the record's skeleton
    redacted = redact(text)
    assert secret not in redacted
    assert json.dumps(secret)[1:-1] not in redacted
    assert SAFE in redacted and "application/json" in redacted  # the rest is kept
    assert redact(redacted) == redacted


@given(name=header_names(), secret=secrets, levels=st.integers(0, 2), data=st.data())
def test_a_line_cut_short_inside_the_value_keeps_none_of_it(name, secret, levels, data):
    record = {"request": {"headers": {name: secret, "accept": "*/*"}}}
    text = nest(record, levels)
    encoded = json.dumps(secret)[1:-1]
    for _ in range(levels):
        encoded = json.dumps(encoded)[1:-1]
    start = text.index(encoded)
    cut = data.draw(st.integers(start + 4, start + len(encoded)))
    kept = text[start:cut]  # the part of the (encoded) secret the cut line holds
    assume(kept not in text[:start])
    assert kept not in redact(text[:cut])


@given(st.text())
def test_text_without_credentials_is_unchanged(text):
    assume(redact_urls(text) == text)
    lowered = text.lower().replace("_", "-")
    assume(not any(name in lowered for name in CREDENTIAL_NAMES))
    assert redact(text) == text


USERINFO = "-._~!$&()*+,;=%"


@given(
    scheme=st.sampled_from(["http", "https", "s3", "postgres+psycopg"]),
    user=st.text(st.characters(categories=("L", "N"), include_characters=USERINFO), min_size=1),
    password=st.text(st.characters(categories=("L", "N"), include_characters=USERINFO + "/:"), min_size=1),
)
def test_url_userinfo_is_removed(scheme, user, password):
    line = f"POST {scheme}://{user}:{password}@host:8000/v1/completions 200"
    assert redact(line) == f"POST {scheme}://{MASK}@host:8000/v1/completions 200"


def test_secrets_of_the_environment_are_masked_wherever_they_appear(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://alice-ops:pw0rd%2Fx@minio:9000")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG")
    monkeypatch.setenv("OPENAI_API_KEY", "abc")  # shorter than 4 characters: not searched for
    message = "Could not resolve host: alice-ops (pw0rd/x, wJalrXUtnFEMI/K7MDENG) abc"
    assert redact(message) == f"Could not resolve host: {MASK} ({MASK}, {MASK}) abc"


def test_quarantined_proxy_captures_keep_no_header_credential(tmp_path):
    bearer, api_key, cookie = "Bearer sk-live-9f8e7d6c5b4a", "xk-1234567890abcdef", "session=s3cr3t-cookie"
    good = json.loads(FIXTURE.read_text().splitlines()[0])
    good["request"]["headers"] = {"Authorization": bearer, "X-Api-Key": api_key, "Cookie": cookie, "Accept": "*/*"}
    broken = json.loads(json.dumps(good))
    del broken["response"]["body"]["choices"][0]["logprobs"]  # quarantined: no logprobs
    nested = {"timestamp": good["timestamp"], "request": json.dumps(good["request"]), "response": "{"}
    lines = [json.dumps(broken), json.dumps(nested), json.dumps(good)[: json.dumps(good).index(api_key) + 8]]
    source = tmp_path / "in" / "capture.jsonl"
    source.parent.mkdir()
    source.write_text("\n".join(lines) + "\n")
    store = Store(str(tmp_path / "store"))
    result = ingest([str(source)], store, max_quarantine_rate=None)
    rows = sorted(store.read("quarantine").to_pylist(), key=lambda row: row["source_line"])
    assert result.quarantined == {"no_logprobs": 1, "unknown_format": 1, "malformed_json": 1}
    assert len(rows) == 3
    kept = json.dumps(rows, default=str) + json.dumps(store.read("traces").to_pylist(), default=str)
    for secret in (bearer, "sk-live-9f8e7d6c5b4a", api_key, api_key[:8], "s3cr3t-cookie"):
        assert secret not in kept
    assert all(SAFE in row["raw"] for row in rows[:2])  # the third line ends before its body
    assert rows[0]["raw"].count(f'"{MASK}"') == 3


def test_the_log_formatter_redacts_message_arguments_and_tracebacks():
    formatter = RedactingFormatter("%(name)s: %(message)s")
    try:
        raise OSError("connect to http://bob:hunter22@db:5432 failed")
    except OSError:
        record = logging.LogRecord("x", logging.INFO, __file__, 1, "POST %s", ("http://u:p4ss@h/v1",), sys.exc_info())
    line = formatter.format(record)
    assert "p4ss" not in line and "hunter22" not in line and "http://***@h/v1" in line


def test_score_ref_logs_no_userinfo_at_any_verbosity(tmp_path):
    class Failing(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["content-length"]))
            self.send_response(503)
            self.send_header("content-length", "0")
            self.end_headers()

    write_traces(tmp_path / "in", 2, seed=1)
    ingest([str(tmp_path / "in")], Store(str(tmp_path / "store")))
    with serving(Failing) as url:
        endpoint = url.replace("http://", "http://opsuser:pa55word-x@") + "/v1/completions"
        for verbosity in ([], ["-v"]):
            args = [*verbosity, "score-ref", "--store", str(tmp_path / "store"), "--ref-model", "ref"]
            args += ["--endpoint", endpoint, "--retries", "1", "--json"]
            env = prl_env({**os.environ, "PRL_REF_API_KEY": "tok-abcdef123456"})
            proc = subprocess.run([sys.executable, "-m", "prl", *args], capture_output=True, text=True, env=env)
            assert proc.returncode == 5, proc.stderr[-2000:]
            output = proc.stdout + proc.stderr
            for secret in ("opsuser", "pa55word-x", "tok-abcdef123456"):
                assert secret not in output, (verbosity, secret)
            if verbosity:
                assert output.count("HTTP Request: POST http://***@127.0.0.1") >= 2, output[-3000:]


def test_an_endpoint_userinfo_is_not_read_as_a_host(monkeypatch):
    """The AWS SDK under pyarrow reads ``user:pw@host`` as a host named ``user``; prl gives it the host alone
    (S3 requests are signed: userinfo means nothing there)."""
    from prl.io.locations import filesystem_for

    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://carol:pw@127.0.0.1:9/")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    fs, path = filesystem_for("s3://bucket/key")
    settings = fs.__reduce__()[1][0]
    assert (settings["endpoint_override"], settings["scheme"], path) == ("127.0.0.1:9", "http", "bucket/key")
