"""A Caffe data layer as a source of batches, decoded on a thread pool ahead of the consumer.

Why: ``caffe test`` overlaps reading and decoding with the forward passes (its prefetch
thread); decoding JPEGs one by one in the consumer's thread would starve a GPU. Records are
read in order in the consumer's thread (cheap: bytes from a memory-mapped database or a file
name), decoded and transformed by the pool straight into the batch arrays, a bounded number
of batches ahead; batches come out in the source's order whatever the threads' timing.
"""
from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Optional

import numpy as np

from amct_torch.errors import DataError

#: decoding threads by default (the machine's cores, at most this many)
MAX_THREADS = 16
#: largest batch of one top, in bytes (a forged shape must not allocate without bound)
MAX_BATCH_BYTES = 4 << 30


def default_threads() -> int:
    """Decoding threads when none are asked for: the cores this process may use, at most
    MAX_THREADS."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(MAX_THREADS, cores))


class DataSource:
    """The batches a data layer gives in Caffe's TEST phase.

    ``tops`` are the layer's top names in order, ``batch_size`` the items per batch,
    ``num_samples`` the records before the source wraps round (None where unknown or
    endless). ``batches(start)`` yields dicts top -> float32 array, from batch ``start`` on,
    endlessly (wrapping round to the first record as Caffe's readers do); stop iterating when
    done. Use it as a context manager or call ``close()``.
    """

    tops: tuple[str, ...]
    batch_size: int
    num_samples: Optional[int]

    def __init__(self, name: str, tops: tuple[str, ...], batch_size: int,
                 num_samples: Optional[int], file: Optional[str] = None) -> None:
        self.name, self.tops, self.batch_size = name, tops, batch_size
        self.num_samples, self.file = num_samples, file
        if batch_size < 1:
            raise DataError("batch_size must be at least 1", file=file, layer=name)

    def top_shapes(self) -> list[tuple[int, ...]]:
        """One batch's shape per top, after the transform."""
        raise NotImplementedError

    def batches(self, start: int = 0) -> Iterator[dict[str, np.ndarray]]:
        """Batches from batch number ``start`` on (see the class docstring)."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the files and threads the source holds."""

    def __enter__(self) -> DataSource:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _check_batch_bytes(self) -> None:
        for top, shape in zip(self.tops, self.top_shapes()):
            nbytes = 4 * int(np.prod(shape, dtype=np.int64))
            if nbytes > MAX_BATCH_BYTES:
                raise DataError(f"one batch of top '{top}' would be {shape} = {nbytes} bytes; "
                                f"at most {MAX_BATCH_BYTES} are allowed (lower batch_size)",
                                file=self.file, layer=self.name)


class RecordSource(DataSource):
    """A source of records decoded one by one into the batch arrays.

    Subclasses give ``_item_shapes`` (per top, one item's shape), ``_records(first)`` (the
    records from record number ``first`` on, endlessly, in order; runs in the consumer's
    thread, so it must be cheap) and ``_fill(record, outs, i)`` (decode one record into row
    ``i`` of the arrays ``outs``; runs on the pool).
    """

    def __init__(self, *args: Any, threads: Optional[int] = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.threads = threads or default_threads()
        self._pool: Optional[ThreadPoolExecutor] = None
        self._lock = threading.Lock()
        self._item_shapes: list[tuple[int, ...]] = []

    def top_shapes(self) -> list[tuple[int, ...]]:
        return [(self.batch_size, *s) for s in self._item_shapes]

    def _records(self, first: int) -> Iterator[Any]:
        raise NotImplementedError

    def _fill(self, record: Any, outs: dict[str, np.ndarray], i: int) -> None:
        raise NotImplementedError

    def _finish(self, outs: dict[str, np.ndarray], records: list[Any]) -> dict[str, np.ndarray]:
        """The batch as yielded (a subclass may build a top from all its records)."""
        return outs

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads,
                                                thread_name_prefix=f"amct-data-{self.name}")
            return self._pool

    def batches(self, start: int = 0) -> Iterator[dict[str, np.ndarray]]:
        if start < 0:
            raise ValueError(f"start must be >= 0, got {start}")
        first = start * self.batch_size
        if self.num_samples:
            first %= self.num_samples
        records = self._records(first)
        pool = self._executor()
        shapes = self.top_shapes()
        ahead = max(2, -(-2 * self.threads // self.batch_size))
        pending: deque[tuple[dict[str, np.ndarray], list[Any], list[Future]]] = deque()

        def submit() -> None:
            outs = {t: np.empty(s, np.float32) for t, s in zip(self.tops, shapes)}
            recs = [next(records) for _ in range(self.batch_size)]
            futs = [pool.submit(self._fill, r, outs, i) for i, r in enumerate(recs)]
            pending.append((outs, recs, futs))

        try:
            for _ in range(ahead):
                submit()
            while True:
                outs, recs, futs = pending.popleft()
                try:
                    for f in futs:
                        f.result()
                except DataError as err:
                    raise _naming_layer(err, self.name) from None
                submit()
                yield self._finish(outs, recs)
        finally:
            for _, _, futs in pending:
                for f in futs:
                    f.cancel()
            close = getattr(records, "close", None)
            if close is not None:
                close()

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def _naming_layer(err: DataError, layer: str) -> DataError:
    """``err`` naming the data layer where it names none yet."""
    if err.layer is None:
        err.layer = layer
        err.args = (err._format(),)
    return err
