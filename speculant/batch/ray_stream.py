"""A Ray dataset's rows, pulled on a thread of their own from the moment the job starts.

Ray Data starts executing a dataset (and its actor pool starts: worker
processes, imports, engine loads: seconds) on the first request for a row.
The batch driver has work of its own before it wants any (the rest of the
config check: loading the plugins, ~1 s), so ``RowStream`` asks at once, on
a pump thread that queues the rows, and that work runs while the actors
start instead of before they do. Rows come out in Ray's order; a failure of
the execution is raised where the rows are taken, in the consumer's thread.

``cancel()`` stops a stream before its rows are taken (the config check
failed; a stream whose rows are being taken is not cancelled: it was
measured to hang Ray Data's row iterator, so ``cancel`` gives up after
``timeout`` and says so): Ray Data's executor is shut down (its actors end) and the
pump thread is joined, all while the driver is still connected (a driver
that disconnected under a running execution would see Ray Data reconnect,
or start a cluster, from its own threads). Ray Data hands out no executor
before the first row, so the stream takes it where the dataset makes it
(``Dataset._create_executor``, Ray 2.60); an executor made after ``cancel``
is shut down at once, and one shut down before its execution began is shut
down again until the pump ends. A Ray without that method leaves ``cancel``
waiting for the pump (``timeout``); ``tests/scaling`` would say so.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

_END = object()


class _Failed:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class RowStream:
    def __init__(self, dataset: Any) -> None:
        """Start pulling the rows of ``dataset`` (a ``ray.data.Dataset``) now."""
        self._dataset = dataset
        self._executor: Any = None
        self._cancelled = False
        make = getattr(dataset, "_create_executor", None)
        if make is not None:
            def capture() -> Any:
                self._executor = make()
                return self._executor

            dataset._create_executor = capture
        self._rows: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._pump, name="speculant-ray-rows", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        try:
            for row in self._dataset.iter_rows():  # the first request starts the execution (and the actors)
                if self._cancelled:
                    return
                self._rows.put(row)
            self._rows.put(_END)
        except BaseException as exc:  # noqa: BLE001 - the consumer raises it, in its own thread
            self._rows.put(_Failed(exc))

    def __iter__(self) -> Iterator[dict[str, Any]]:
        while True:
            item = self._rows.get()
            if item is _END:
                return
            if isinstance(item, _Failed):
                raise item.exc
            yield item

    def cancel(self, timeout: float = 30.0) -> bool:
        """Stop the execution (its actors end) and the pump, before any row is taken; True once the pump has
        ended."""
        self._cancelled = True
        deadline = time.monotonic() + timeout
        while self._thread.is_alive() and time.monotonic() < deadline:
            if self._executor is not None:
                self._executor.shutdown(force=True)  # a no-op until its execution has begun
            self._thread.join(0.05)
        return not self._thread.is_alive()
