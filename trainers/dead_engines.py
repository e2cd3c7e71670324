"""A rollout engine that died under its server: one error that names it, the step and the resume.

vLLM runs its model in an engine process of its own (``VLLM::EngineCore``) under verl's replica actor
(``vLLMHttpServer``). When that process dies (killed, out of memory), the actor lives on and every call into the
engine raises vLLM's ``EngineDeadError``: "EngineCore encountered an issue. See stack trace (above) for the root
cause", wrapped in Ray's ``RayTaskError`` of whichever call met it first (a generate, an abort before a weight sync).
It names no replica and no step, and says nothing of what to do. The pipelined trainers wrap their loop in
:func:`diagnosing_dead_engines`, which turns it into :class:`RolloutEngineDiedError`. No replica is restarted in
place (docs/faults.md says what is not survived yet): the run stops at once, rather than at the stall watch.
"""

from __future__ import annotations

import contextlib
import re
from typing import Callable, Optional

ENGINE_DEAD = "EngineDeadError"  # vLLM's (vllm.v1.engine.exceptions); matched by name, vLLM being optional
# The head of a RayTaskError's text, which names the actor's call and its process (the error Ray re-raises keeps no
# attributes of its own): "ray::CPUvLLMHttpServer.abort_all_requests() (pid=10987, ip=192.0.2.2, actor_id=...".
RAY_CALL = re.compile(r"ray::(?P<actor>\w+)\.(?P<call>\w+)\(\)\S*\s*\(pid=(?P<pid>\d+), ip=(?P<ip>[^,)\s]+)")


class RolloutEngineDiedError(RuntimeError):
    """A rollout replica's engine process died; the run cannot go on without it."""


def _chain(error: BaseException):
    """``error``, then what it wraps: Ray's ``cause``, ``__cause__`` and ``__context__``, each once."""
    seen, todo = set(), [error]
    while todo:
        current = todo.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        todo += [getattr(current, "cause", None), current.__cause__, current.__context__]


def engine_death(error: BaseException) -> Optional[BaseException]:
    """The exception in ``error``'s chain that says an engine died (Ray's ``RayTaskError(EngineDeadError)`` is both),
    preferring one that names the actor's call; None if none does."""
    dead = [e for e in _chain(error) if any(cls.__name__ == ENGINE_DEAD for cls in type(e).__mro__)]
    with_call = [e for e in dead if RAY_CALL.search(str(e))]
    return (with_call or dead or [None])[0]


def describe_dead_engine(death: BaseException, step: Optional[int], checkpoint_dir: str) -> str:
    from verl_pipe.trainers.checkpoint_guard import resume_advice

    call = RAY_CALL.search(str(death))
    server = (f"the rollout server {call['actor']} (pid {call['pid']} on {call['ip']}), met in its {call['call']} "
              "call" if call else "a rollout server")  # fmt: skip
    when = "during the run" if step is None else f"during step {step}"
    return (
        f"The engine process under {server}, died {when}: vLLM raised {ENGINE_DEAD} (its engine process, "
        "VLLM::EngineCore, exited: killed, or out of memory; the server's log holds its last lines). verl-pipe does "
        "not restart a replica in place, so the run cannot go on without it. Check the machine's memory (dmesg for "
        f"the OOM killer) and rerun the same command: {resume_advice(checkpoint_dir)}"
    )


@contextlib.contextmanager
def diagnosing_dead_engines(step: Callable[[], Optional[int]], checkpoint_dir: str):
    """Run the trainer's loop inside; an error that carries vLLM's ``EngineDeadError`` becomes
    :class:`RolloutEngineDiedError`; any other passes unchanged."""
    try:
        yield
    except Exception as error:
        death = None if isinstance(error, RolloutEngineDiedError) else engine_death(error)
        if death is None:
            raise
        raise RolloutEngineDiedError(describe_dead_engine(death, step(), checkpoint_dir)) from error
