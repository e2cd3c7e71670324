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
:class:`RolloutReplicaDiedError`. A weight sync is the one call that meets neither: verl's bucket sender waits on
the engine's socket with no timeout, so a sync into an engine that is dead, or dies mid-transfer, would wait for
ever; :func:`call_while_engines_live` asks the servers about their engines before and during it. No replica is
restarted in place (docs/faults.md says what is not survived yet).
"""

from __future__ import annotations

import contextlib
import re
import threading
from typing import Any, Callable, Optional

import ray

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
    return f"{what}. {_what_to_do(checkpoint_dir)}"


def _what_to_do(checkpoint_dir: str) -> str:
    from verl_pipe.trainers.checkpoint_guard import resume_advice

    return ("verl-pipe does not restart a replica in place, so the run cannot go on without it. Check the machine's "
            f"memory (dmesg for the OOM killer) and rerun the same command: {resume_advice(checkpoint_dir)}")


def engine_health(server, timeout_s: float = 5.0) -> Optional[str]:
    """What a rollout server says of its engine (``engine_health``, where its class has one: vLLM's server on the CPU
    backend), None when it is well or cannot say."""
    return engine_healths([server], timeout_s)[0]


def engine_healths(servers: list, timeout_s: float = 5.0) -> list[Optional[str]]:
    """:func:`engine_health` of every server, all asked at once (servers that cannot tell, or do not answer within
    ``timeout_s``, say None)."""
    asked = {}
    for index, server in enumerate(servers):
        try:
            asked[index] = server.engine_health.remote()
        except AttributeError:  # a server class without engine_health (the hf server)
            continue
    ready, _ = ray.wait(list(asked.values()), num_returns=len(asked), timeout=timeout_s) if asked else ([], [])
    problems: list[Optional[str]] = [None] * len(servers)
    for index, ref in asked.items():
        if ref in ready:
            try:
                problems[index] = ray.get(ref)
            except ray.exceptions.RayError:
                pass
    return problems


def raise_if_an_engine_died(replicas, step: Optional[int], checkpoint_dir: str) -> None:
    """Ask each replica's servers about their engines (one call each; servers that cannot tell say nothing) and
    raise :class:`RolloutReplicaDiedError` for the first that is dead."""
    for replica in replicas:
        for server in replica.servers:
            if problem := engine_health(server):
                raise RolloutReplicaDiedError(
                    f"Rollout replica {replica.replica_rank} died during step {step}: its server says {problem}. "
                    f"{_what_to_do(checkpoint_dir)}"
                )


def call_while_engines_live(call: Callable[[], Any], replicas, step: Optional[int], checkpoint_dir: str,
                            check_every_s: float = 2.0) -> Any:  # fmt: skip
    """``call()`` (a weight sync), with the replicas' engines checked before it and every ``check_every_s`` while it
    waits: a dead engine raises :class:`RolloutReplicaDiedError` instead of a wait for ever. The call then runs on
    in its own daemon thread, stuck on a socket nothing will answer, until the run's processes end."""
    raise_if_an_engine_died(replicas, step, checkpoint_dir)
    if not any(getattr(server, "engine_health", None) is not None for r in replicas for server in r.servers):
        return call()  # no server can tell of its engine (the hf server's engine is the server itself)
    outcome: dict[str, Any] = {}
    finished = threading.Event()

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as error:  # noqa: BLE001 - handed to the caller's thread as is
            outcome["error"] = error
        finally:
            finished.set()

    threading.Thread(target=run, name="weight-sync", daemon=True).start()
    while not finished.wait(check_every_s):
        raise_if_an_engine_died(replicas, step, checkpoint_dir)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


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
