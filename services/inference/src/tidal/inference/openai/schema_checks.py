"""Tools' JSON schemas checked in one worker process, off the replica's interpreter.

The check (`tool_schemas`) is pure Python and costs time in the schemas' size: on a
thread it would hold the GIL against the event loop that answers HTTP and gRPC health.
The worker is started by spawn on the first check that needs it (never fork: the replica
holds torch's threads), dies with the replica and stops with its server. Lists that passed
are remembered by digest, so an agent sending the same tools every turn pays once.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import multiprocessing
import os
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from tidal.common.errors import InvalidArgument, Unavailable
from tidal.inference.openai.tool_schemas import problem_in_json, start_worker


class SchemaChecks:
    """Checks tools' JSON schemas in one worker process, remembering the lists that
    passed; `close` stops the worker."""

    def __init__(self, remembered: int = 256) -> None:
        self._pool: ProcessPoolExecutor | None = None
        self._passed: OrderedDict[bytes, None] = OrderedDict()
        self._remembered = remembered

    @property
    def running(self) -> bool:
        """Whether the worker process is started (a check of a remembered list starts none)."""
        return self._pool is not None

    async def check(self, tools: Sequence[Mapping[str, Any]]) -> None:
        """InvalidArgument naming the first tool whose parameters are not a usable schema
        (`tools[i].function.parameters`); Unavailable if the worker died meanwhile."""
        if not tools:
            return
        text = json.dumps(list(tools), sort_keys=True, ensure_ascii=False)
        key = hashlib.sha256(text.encode(errors="surrogatepass")).digest()
        if key in self._passed:
            self._passed.move_to_end(key)
            return
        pool = self._worker()
        try:
            problem = await asyncio.wrap_future(pool.submit(problem_in_json, text))
        except BrokenProcessPool:
            self._drop(pool)  # the next check starts a fresh worker
            raise Unavailable("the tool schema checker stopped; retry the request") from None
        if problem is not None:
            raise InvalidArgument(*problem)
        self._passed[key] = None
        while len(self._passed) > self._remembered:
            self._passed.popitem(last=False)

    def close(self) -> None:
        """Stop the worker: a check under way ends (bounded by `max_tools_bytes`), none
        queued starts."""
        if self._pool is not None:
            self._drop(self._pool)

    def _worker(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                1,
                # spawn runs a script's `__main__` again in the worker, under its
                # `if __name__ == "__main__"` guard: the `tidal` entry points have one
                mp_context=multiprocessing.get_context("spawn"),
                initializer=start_worker,
                initargs=(os.getpid(),),
            )
        return self._pool

    def _drop(self, pool: ProcessPoolExecutor) -> None:
        if self._pool is pool:
            self._pool = None
        pool.shutdown(wait=False, cancel_futures=True)
