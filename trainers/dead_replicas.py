"""A rollout replica that died (its server actor, or the engine process under it): one error that names it, the
step and the resume.

Two ways a replica dies, and what reaches the trainer when its loop next calls it (a generate, an abort before a
weight sync, the weight RPC itself):

* its server actor (``vLLMHttpServer``, ``HFRolloutServer``) is gone: Ray's ``ActorDiedError``, which names the
  actor's class and pid but not the step, nor what to do;
* vLLM's engine process (``VLLM::EngineCore``) is gone under a live server: vLLM's ``EngineDeadError``, "EngineCore
  encountered an issue. See stack trace (above) for the root cause", wrapped in Ray's ``RayTaskError`` of the call
  that met it.

The pipelined trainers wrap their loop in :func:`diagnosing_dead_replicas`, which turns either into
:class:`RolloutReplicaDiedError`. No replica is restarted in place (docs/faults.md says what is not survived yet).
"""

from __future__ import annotations

import contextlib
import re
from typing import Callable, Optional

ENGINE_DEAD = "EngineDeadError"  # vLLM's (vllm.v1.engine.exceptions); matched by name, vLLM being optional
# The head of a RayTaskError's text, which names the actor's call and its process (the error Ray re-raises keeps no
# attributes of its own): "ray::CPUvLLMHttpServer.abort_all_requests() (pid=10987, ip=192.0.2.2, actor_id=...".
RAY_CALL = re.compile(r"ray::(?P<actor>\w+)\.(?P<call>\w+)\(\)\S*\s*\(pid=(?P<pid>\d+), ip=(?P<ip>[^,)\s]+)")
# A rollout server's class, as Ray's ActorDiedError names the dead actor ("class_name: CPUvLLMHttpServer").
SERVER_CLASS = re.compile(r"class_name: (?P<actor>\w*(?:vLLMHttpServer|RolloutServer))\b")
DEAD_ACTOR_FIELD = r"\b{}: (\S+)"


class RolloutReplicaDiedError(RuntimeError):
    """A rollout replica's server or engine process died; the run cannot go on without it."""


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


def server_death(error: BaseException) -> Optional[BaseException]:
    """The ``ActorDiedError`` in ``error``'s chain whose dead actor is a rollout server; None if there is none."""
    for e in _chain(error):
        if any(cls.__name__ == "ActorDiedError" for cls in type(e).__mro__) and SERVER_CLASS.search(str(e)):
            return e
    return None


def _field(text: str, name: str) -> str:
    found = re.search(DEAD_ACTOR_FIELD.format(name), text)
    return found.group(1) if found else "?"


def describe_dead_replica(death: BaseException, step: Optional[int], checkpoint_dir: str) -> str:
    from verl_pipe.trainers.checkpoint_guard import resume_advice

    text = str(death)
    when = "during the run" if step is None else f"during step {step}"
    if server := SERVER_CLASS.search(text):
        what = (f"The rollout server {server['actor']} (actor {_field(text, 'name')}, pid {_field(text, 'pid')} on "
                f"{_field(text, 'ip')}) died {when}: Ray says its worker process died (killed, or out of memory)")
    else:  # the engine under a live server
        call = RAY_CALL.search(text)
        under = (f"the rollout server {call['actor']} (pid {call['pid']} on {call['ip']}), met in its {call['call']} "
                 "call" if call else "a rollout server")  # fmt: skip
        what = (f"The engine process under {under}, died {when}: vLLM raised {ENGINE_DEAD} (its engine process, "
                "VLLM::EngineCore, exited: killed, or out of memory; the server's log holds its last lines)")
    return (
        f"{what}. verl-pipe does not restart a replica in place, so the run cannot go on without it. Check the "
        f"machine's memory (dmesg for the OOM killer) and rerun the same command: {resume_advice(checkpoint_dir)}"
    )


@contextlib.contextmanager
def diagnosing_dead_replicas(step: Callable[[], Optional[int]], checkpoint_dir: str):
    """Run the trainer's loop inside; an error that carries a dead rollout server's ``ActorDiedError`` or vLLM's
    ``EngineDeadError`` becomes :class:`RolloutReplicaDiedError`; any other passes unchanged."""
    try:
        yield
    except Exception as error:
        if isinstance(error, RolloutReplicaDiedError):
            raise
        death = server_death(error) or engine_death(error)
        if death is None:
            raise
        raise RolloutReplicaDiedError(describe_dead_replica(death, step(), checkpoint_dir)) from error
