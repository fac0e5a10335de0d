"""Each option is declared once, in its options model (prl.options): the command line's flags, help texts,
defaults and ranges are the model's, and a recipe checks each key by the model's kind and range, naming the file,
the table and the key."""

from __future__ import annotations

import enum
from dataclasses import MISSING, fields
from pathlib import Path

import pytest
import typer

from prl.cli import app
from prl.errors import UsageError
from prl.options import (
    CheckTokensOptions,
    IngestOptions,
    MaintainOptions,
    ScoreRefOptions,
    StoreOptions,
    meta,
)
from prl.pipeline import recipe

COMMANDS = {
    "ingest": (IngestOptions, StoreOptions),
    "check-tokens": (CheckTokensOptions, StoreOptions),
    "score-ref": (ScoreRefOptions, StoreOptions),
    "build-shards": (StoreOptions,),
    "maintain": (MaintainOptions, StoreOptions),
}
"""The models each command takes options from."""


def _params(name: str) -> dict[str, object]:
    group = typer.main.get_command(app)
    command = group.commands[name]  # type: ignore[attr-defined]
    return {opt: p for p in command.params for opt in p.opts}


def _cli_default(param) -> object:
    return param.default.value if isinstance(param.default, enum.Enum) else param.default


def test_every_cli_option_of_a_model_has_the_models_flag_help_default_and_range():
    seen = []
    for name, models in COMMANDS.items():
        params = _params(name)
        for model in models:
            for f in fields(model):
                spec = meta(model, f.name)
                if spec.flag is None or spec.flag not in params:
                    continue
                param = params[spec.flag]
                seen.append((name, spec.flag))
                if (name, spec.flag) != ("ingest", "--engine"):  # ingest says where each kind of file is read
                    assert param.help == spec.help, (name, spec.flag)
                if f.default is MISSING:
                    assert param.required, (name, spec.flag)
                elif (name, spec.flag) == ("build-shards", "--out"):
                    assert param.required  # optional in [store] (no [shards] table), required by the command
                else:
                    expected = (not f.default) if spec.negated_flag else f.default
                    assert not param.required and _cli_default(param) == expected, (name, spec.flag)
                if spec.kind == "int":
                    assert (param.type.min, param.type.max) == (spec.minimum, spec.maximum), (name, spec.flag)
    assert seen == [
        ("ingest", "--format"),
        ("ingest", "--policy-version"),
        ("ingest", "--group-field"),
        ("ingest", "--finish-reason"),
        ("ingest", "--agent-field"),
        ("ingest", "--max-quarantine-rate"),
        ("ingest", "--store"),
        ("ingest", "--engine"),
        ("check-tokens", "--tokenizer"),
        ("check-tokens", "--chat-template"),
        ("check-tokens", "--max-drift-rate"),
        ("check-tokens", "--sample-rate"),
        ("check-tokens", "--fail-on-warn"),
        ("check-tokens", "--max-template-timeouts"),
        ("check-tokens", "--store"),
        ("check-tokens", "--engine"),
        ("score-ref", "--ref-model"),
        ("score-ref", "--endpoint"),
        ("score-ref", "--model"),
        ("score-ref", "--backend"),
        ("score-ref", "--served-model"),
        ("score-ref", "--batch-tokens"),
        ("score-ref", "--concurrency"),
        ("score-ref", "--retries"),
        ("score-ref", "--timeout"),
        ("score-ref", "--max-quarantine-rate"),
        ("score-ref", "--store"),
        ("score-ref", "--engine"),
        ("build-shards", "--store"),
        ("build-shards", "--out"),
        ("build-shards", "--engine"),
        ("maintain", "--retention-hours"),
        ("maintain", "--target-mb"),
        ("maintain", "--store"),
    ]


def test_cli_defaults_and_help_are_the_values_written_in_the_models():
    ingest, check, score, maintain = (_params(n) for n in ("ingest", "check-tokens", "score-ref", "maintain"))
    assert (_cli_default(ingest["--format"]), ingest["--format"].help) == (
        "auto",
        "Wire format, or 'auto' to detect it per file.",
    )
    assert _cli_default(ingest["--max-quarantine-rate"]) == 0.05
    assert _cli_default(ingest["--engine"]) == "local"
    assert ingest["--engine"].help.startswith("local: this machine; ray: the Ray cluster at RAY_ADDRESS reads the")
    assert (_cli_default(check["--sample-rate"]), _cli_default(check["--fail-on-warn"])) == (1.0, False)
    assert check["--fail-on-warn"].is_flag
    assert (check["--max-template-timeouts"].type.min, check["--max-template-timeouts"].type.max) == (1, 1_000_000)
    assert [_cli_default(score[f]) for f in ("--backend", "--batch-tokens", "--concurrency", "--retries")] == [
        "auto",
        16384,
        8,
        5,
    ]
    assert _cli_default(score["--timeout"]) == 120.0
    assert (_cli_default(maintain["--retention-hours"]), _cli_default(maintain["--target-mb"])) == (168, 128)
    assert IngestOptions.format == "auto" and CheckTokensOptions.allow_warn is True


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "cfg" / "r.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


BASE = {
    "store": 'uri = "s"\n',
    "ingest": 'sources = "a"\n',
    "check": 'tokenizer = "."\n',
    "score_ref": 'ref_model = "r"\nendpoint = "http://127.0.0.1:9"\n',
    "maintain": "",
}


@pytest.mark.parametrize(
    ("table", "line", "message"),
    [
        ("ingest", "format = 3", "[ingest] format: expected a non-empty string, got 3"),
        ("ingest", 'policy_version = ""', "[ingest] policy_version: expected a non-empty string, got ''"),
        ("ingest", "max_quarantine_rate = 1.5", "[ingest] max_quarantine_rate: expected a number in [0, 1], got 1.5"),
        ("store", 'engine = "spark"', "[store] engine: expected one of local, ray, got 'spark'"),
        ("check", 'allow_warn = "yes"', "[check] allow_warn: expected true or false, got 'yes'"),
        ("check", "sample_rate = 0", "[check] sample_rate: expected a number in (0, 1], got 0"),
        ("check", "sample_rate = true", "[check] sample_rate: expected a number in (0, 1], got True"),
        (
            "check",
            "max_template_timeouts = 1000001",
            "[check] max_template_timeouts: expected an integer in [1, 1000000], got 1000001",
        ),
        ("check", "max_template_timeouts = 2.0", "[check] max_template_timeouts: expected an integer in [1, 1000000]"),
        ("score_ref", 'backend = "hf"', "[score_ref] backend: expected one of auto, vllm, sglang, tinker, got 'hf'"),
        ("score_ref", "served_model = false", "[score_ref] served_model: expected a non-empty string, got False"),
        ("score_ref", "retries = -1", "[score_ref] retries: expected an integer in [0, 100], got -1"),
        ("score_ref", "timeout = 0", "[score_ref] timeout: expected a number in (0, 86400], got 0"),
        ("score_ref", "timeout = nan", "[score_ref] timeout: expected a number in (0, 86400], got nan"),
        (
            "score_ref",
            "batch_tokens = 1073741825",
            "[score_ref] batch_tokens: expected an integer in [1, 1073741824], got 1073741825",
        ),
        ("maintain", "retention_hours = 0", "[maintain] retention_hours: expected an integer in [1, 876000], got 0"),
        ("maintain", 'target_mb = "128"', "[maintain] target_mb: expected an integer in [1, 1048576], got '128'"),
    ],
)
def test_recipe_rejects_a_bad_value_naming_file_table_and_key(tmp_path, table, line, message):
    tables = {"store": BASE["store"], table: BASE[table] + line + "\n"}
    path = _write(tmp_path, "".join(f"[{name}]\n{body}" for name, body in tables.items()))
    with pytest.raises(UsageError) as info:
        recipe.load(path)
    assert str(info.value).startswith(f"{path}: {message}"), str(info.value)


WRONG_TYPE = {"string": "[1]", "bool": "1", "int": '"x"', "number": '"x"', "seconds": '"x"'}


def test_every_scalar_key_of_every_table_refuses_a_wrong_type(tmp_path):
    """Each string, boolean and numeric key (not only those above) is checked by its model's kind."""
    checked = 0
    for table, model in recipe.TABLES.items():
        for f in fields(model):
            spec = meta(model, f.name)
            if spec.kind not in WRONG_TYPE:
                continue
            body = "\n".join(
                line for line in BASE.get(table, 'sources = "a"\n').splitlines() if not line.startswith(f.name)
            )
            text = '[store]\nuri = "s"\n' if table != "store" else ""
            text += f"[{table}]\n{body}\n{f.name} = {WRONG_TYPE[spec.kind]}\n"
            path = _write(tmp_path, text)
            with pytest.raises(UsageError) as info:
                recipe.load(path)
            assert str(info.value).startswith(f"{path}: [{table}] {f.name}: expected "), str(info.value)
            checked += 1
    assert checked == 22
