"""Engine changes requested from any thread, applied at step boundaries.

``LLMEngine`` is driven by one loop calling ``step()``. ``add_request`` and
``abort_request`` may come from other threads (a server's request handlers):
they validate in the caller's thread, then hand the change (queue this
request, abort that one) to ``submit``. Outside a step it is applied at once,
under the lock; while a step runs it waits in the inbox and the stepping
thread applies it when the step ends, so a step never sees its scheduler,
block pools or proposer state change under it.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager

logger = logging.getLogger(__name__)


class Inbox:
    def __init__(self) -> None:
        self.lock = threading.RLock()  # also guards the engine's request table
        self._ops: deque[Callable[[], None]] = deque()
        self._stepping = False

    @property
    def pending(self) -> int:
        return len(self._ops)

    def submit(self, op: Callable[[], None]) -> None:
        """Apply ``op`` now, or at the end of the running step."""
        with self.lock:
            if self._stepping:
                self._ops.append(op)
            else:
                op()

    @contextmanager
    def stepping(self) -> Iterator[None]:
        """Mark a step as running; apply what arrived during it when it ends."""
        with self.lock:
            if self._stepping:
                raise RuntimeError("LLMEngine.step() called while another step() is running; drive the "
                                   "engine from one loop (other threads may call add_request and "
                                   "abort_request at any time)")
            self._drain()
            self._stepping = True
        try:
            yield
        finally:
            with self.lock:
                self._stepping = False
                self._drain()

    def _drain(self) -> None:
        while self._ops:
            op = self._ops.popleft()
            try:
                op()
            except Exception:  # one bad change must not block the others
                logger.exception("applying a queued engine change failed")
