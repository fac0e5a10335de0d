"""What an ingest run reports: one :class:`FileReport` per source file and the run's :class:`IngestResult`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from prl import bounds
from prl.errors import ExitCode
from prl.text import counted

DEFAULT_MAX_QUARANTINE_RATE = bounds.MAX_QUARANTINE_RATE


@dataclass
class FileReport:
    """What happened to one source file."""

    uri: str
    format: str | None = None
    status: str = "ingested"  # ingested | unchanged | empty | skipped (not a regular file) | failed
    records: int = 0
    samples: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    already_present: int = 0
    quarantined: dict[str, int] = field(default_factory=dict)
    bytes: int = 0
    sha256: str | None = None
    error: str | None = None
    held_back_bytes: int = 0
    """Bytes of an unterminated last line left for a later run (a plain file still being written)."""
    bytes_read: int = 0
    """Bytes read by this run: from :attr:`resumed_from` to the end (``bytes`` is the file's size)."""
    resumed_from: int = 0
    """The byte this run began at: 0, or where an earlier run stopped in a plain file that grew since."""
    formats: dict[str, int] = field(default_factory=dict)
    """Decoded records per format that read them (detection is per record: a proxy log may mix formats)."""


@dataclass
class IngestResult:
    """Summary of an ingest run; ``exit_code`` follows docs/design.md."""

    store: str
    files: list[FileReport] = field(default_factory=list)
    samples: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    records: int = 0
    already_present: int = 0
    quarantined: dict[str, int] = field(default_factory=dict)
    bytes_read: int = 0
    seconds: float = 0.0
    versions: dict[str, int | None] = field(default_factory=dict)
    dry_run: bool = False
    max_quarantine_rate: float | None = DEFAULT_MAX_QUARANTINE_RATE

    @property
    def quarantined_total(self) -> int:
        return sum(self.quarantined.values())

    @property
    def quarantine_rate(self) -> float:
        seen = self.samples + self.quarantined_total
        return self.quarantined_total / seen if seen else 0.0

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def exit_code(self) -> ExitCode:
        if any(f.status == "failed" for f in self.files):
            return ExitCode.USAGE
        if self.max_quarantine_rate is not None and self.quarantine_rate > self.max_quarantine_rate:
            return ExitCode.DATA_PROBLEMS
        return ExitCode.OK

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(
            command="ingest",
            quarantined_total=self.quarantined_total,
            quarantine_rate=round(self.quarantine_rate, 6),
            tokens=self.tokens,
            tokens_per_second=round(self.tokens / self.seconds, 1) if self.seconds else None,
            exit_code=int(self.exit_code),
        )
        return out

    def headline(self) -> str:
        """``ingest: 120 samples new (48,000 tokens), 3 already present, 2 quarantined (1.64%); 4 files (1
        unchanged, 0 failed)``."""
        unchanged = sum(1 for f in self.files if f.status == "unchanged")
        failed = sum(1 for f in self.files if f.status == "failed")
        return (
            f"ingest{' (dry run)' if self.dry_run else ''}: {counted(self.samples, 'sample')} new "
            f"({counted(self.tokens, 'token')}), "
            f"{self.already_present:,} already present, {self.quarantined_total:,} quarantined "
            f"({self.quarantine_rate:.2%}); {counted(len(self.files), 'file')} ({unchanged} unchanged, {failed} failed)"
        )
