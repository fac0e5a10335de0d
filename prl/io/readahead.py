"""Reading ahead: a background thread produces the next chunks of a source (reading, hashing, decompressing and
counting lines, which release the GIL) while its consumer parses."""

from __future__ import annotations

import queue
import threading
from collections.abc import Generator, Iterator
from typing import TypeVar

_END = object()
T = TypeVar("T")


def read_ahead(chunks: Generator[T, None, None], depth: int) -> Iterator[T]:
    """Iterate ``chunks`` while a background thread produces up to ``depth`` chunks ahead (memory: ``depth`` + 1
    chunks). An error in the producer is raised in the consumer; a consumer that stops early stops the producer
    (after at most one more read) and closes ``chunks``."""
    ready: queue.Queue[object] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def offer(item: object) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for chunk in chunks:
                if not offer(chunk):
                    return
            offer(_END)
        except BaseException as exc:  # handed to the consumer, which raises it
            offer(exc)
        finally:
            chunks.close()

    thread = threading.Thread(target=produce, name="prl-read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            item = ready.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item  # type: ignore[misc]
    finally:
        stop.set()
        thread.join()


__all__ = ["read_ahead"]
