"""Score samples in processes of their own, so a scoring process that dies costs only its own sample.

The host side of one code score is small (a sandbox is its own process tree, with its own limits), but it runs
in the reward worker, a Ray actor: if the kernel's OOM killer (or anything else) took the actor down mid-sample,
verl's agent loop would lose every sample routed to it and the step with them. Here each concurrency slot is a
single-process pool forked from one forkserver that has the reward module loaded (a new process costs a fork,
not an import). A slot whose process dies is replaced and the sample is reported as
:class:`ScoringProcessDied`; the manager retries it once, then gives it ``internal_error``. A sample that
outlives its deadline has its process killed, so a stuck score never holds a slot.

The scoring processes are the first the OOM killer picks (``oom_score_adj`` 1000, like the sandboxes), so under
memory pressure it takes a sample, not the worker.
"""

from __future__ import annotations

import asyncio
import functools
import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

# What the forkserver imports once; every scoring process is forked from it with these already loaded.
PRELOAD = ["verl_pipe.reward_score"]


class ScoringProcessDied(RuntimeError):
    """The process scoring this sample died (killed, out of memory); the sample may be tried again."""


def _prefer_as_oom_victim() -> None:
    try:
        with open("/proc/self/oom_score_adj", "w") as handle:
            handle.write("1000")
    except OSError:
        pass


def _context() -> multiprocessing.context.BaseContext:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    return context


class ScoringProcesses:
    """``slots`` single-process pools; :meth:`score` runs ``score_fn(**kwargs)`` in a free one."""

    def __init__(self, score_fn: Callable[..., Any], slots: int):
        self.score_fn = score_fn
        self.context = _context()
        self.free: asyncio.Queue[ProcessPoolExecutor] = asyncio.Queue()
        for _ in range(slots):
            self.free.put_nowait(self._new_pool())

    def _new_pool(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(max_workers=1, mp_context=self.context, initializer=_prefer_as_oom_victim)

    @staticmethod
    def _kill(pool: ProcessPoolExecutor) -> None:
        # The executor keeps its processes in a private dict; there is no public way to kill a stuck task.
        for process in list((getattr(pool, "_processes", None) or {}).values()):
            try:
                process.kill()
            except (OSError, ValueError):
                pass
        pool.shutdown(wait=False, cancel_futures=True)

    async def score(self, kwargs: dict[str, Any]) -> Any:
        pool = await self.free.get()
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(pool, functools.partial(self.score_fn, **kwargs))
        except BrokenProcessPool:
            self._kill(pool)
            pool = self._new_pool()
            raise ScoringProcessDied("the scoring process died while scoring this sample") from None
        except asyncio.CancelledError:
            # Cancelled at the sample deadline (asyncio.wait_for): the process may still be busy; replace it.
            self._kill(pool)
            pool = self._new_pool()
            raise
        finally:
            self.free.put_nowait(pool)

    def close(self) -> None:
        while not self.free.empty():
            self.free.get_nowait().shutdown(wait=False, cancel_futures=True)

