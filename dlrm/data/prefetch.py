"""A background thread that reads a batch iterator ahead of the training loop (``data.prefetch``).

The binary loader (:mod:`dlrm.data.binary`) builds its batches on the host with numpy copies that release the GIL,
so a thread keeps ``data.prefetch`` batches ready while the step runs; exceptions reach the consumer, and the
thread stops when the consumer stops iterating.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Iterator


class Prefetcher:
    """Run an iterator in a background thread, ``depth`` items ahead; exceptions surface in the consumer.

    The thread stops when the consumer stops iterating (generator closed or garbage-collected) or on
    :meth:`close`.
    """

    _DONE = object()

    def __init__(self, it: Iterator[Any], depth: int) -> None:
        self.q: "queue.Queue[Any]" = queue.Queue(maxsize=max(1, depth))
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(it,), daemon=True, name="dlrm-prefetch")
        self.thread.start()

    def _run(self, it: Iterator[Any]) -> None:
        try:
            for item in it:
                self._put(item)
                if self.stop.is_set():
                    return
            self._put(self._DONE)
        except BaseException as e:  # handed to the consumer, which re-raises it
            self._put(e)

    def _put(self, item: Any) -> None:
        while not self.stop.is_set():
            try:
                self.q.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def __iter__(self) -> Iterator[Any]:
        try:
            while True:
                item = self.q.get()
                if item is self._DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self.close()

    def close(self) -> None:
        """Stop the thread and wait for it (it checks between batches): no thread may still be building a batch
        with torch while the interpreter shuts down."""
        self.stop.set()
        if self.thread is not threading.current_thread():
            self.thread.join(timeout=30)


def prefetched(gen: Iterator[Any], depth: int) -> Iterator[Any]:
    """``gen`` read ``depth`` items ahead by a :class:`Prefetcher` thread; ``gen`` itself when ``depth`` is 0."""
    return iter(Prefetcher(gen, depth)) if depth > 0 else gen


def expanded(fn: Callable[[Any], Any], it: Iterator[Any]) -> Iterator[Any]:
    """``fn`` of each of ``it``'s items, in the consuming thread: the device work of
    :meth:`dlrm.data.binary.BatchReader.expand` queues on that thread's current stream, in order with the training
    step. Closing this closes ``it`` (a prefetching source stops its thread)."""
    try:
        for item in it:
            yield fn(item)
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()
