"""A rollout replica that died stops the pipelined trainers with one error naming it, the step and the resume
(:mod:`verl_pipe.trainers.dead_replicas`): its server actor (Ray's ``ActorDiedError``, which names neither), or the
vLLM engine process under a live server (vLLM's "EngineCore encountered an issue. See stack trace (above) for the
root cause").

The errors are built as Ray hands them to the trainer, with the texts ``make chaos`` recorded: a ``RayTaskError`` of
the server's call that is also vLLM's ``EngineDeadError`` (matched by name: vLLM is not in this virtualenv), and an
``ActorDiedError`` naming the dead actor.
"""

from __future__ import annotations

import os

import pytest
from ray.exceptions import ActorDiedError, RayTaskError

from verl_pipe.trainers.dead_replicas import (
    RolloutReplicaDiedError,
    diagnosing_dead_replicas,
    engine_death,
    server_death,
)


class EngineDeadError(Exception):  # stands for vllm.v1.engine.exceptions.EngineDeadError
    pass


# What Ray's text of the error held in `make chaos --faults engine_kill` (one_off_pipeline), shortened.
RAY_TRACEBACK = (
    "\x1b[36mray::CPUvLLMHttpServer.abort_all_requests()\x1b[39m (pid=10987, ip=192.0.2.2, "
    "actor_id=b5a1ac25c8968df843b55e0602000000, repr=<verl_pipe.backends.cpu.vllm_replica.CPUvLLMHttpServer object "
    "at 0x7f081da102d0>)\n  File \"/work/main/verl_pipe/backends/cpu/vllm_replica.py\", line 119, in "
    "abort_all_requests\n    raise EngineDeadError()\nvllm.v1.engine.exceptions.EngineDeadError: EngineCore "
    "encountered an issue. See stack trace (above) for the root cause."
)


def _from_server(cause: Exception) -> Exception:
    return RayTaskError("CPUvLLMHttpServer.abort_all_requests", RAY_TRACEBACK, cause).as_instanceof_cause()


def _checkpoints(tmp_path, saved: int) -> str:
    os.makedirs(tmp_path / f"global_step_{saved}")
    (tmp_path / "latest_checkpointed_iteration.txt").write_text(str(saved))
    return str(tmp_path)


def test_a_dead_engine_is_named_with_its_server_the_step_and_the_resume(tmp_path):
    checkpoints = _checkpoints(tmp_path, saved=2)
    with pytest.raises(RolloutReplicaDiedError) as caught:
        with diagnosing_dead_replicas(lambda: 3, checkpoints):
            raise _from_server(EngineDeadError("EngineCore encountered an issue. See stack trace (above)"))
    text = str(caught.value)
    assert "CPUvLLMHttpServer (pid 10987 on 192.0.2.2), met in its abort_all_requests call" in text, text
    assert "died during step 3" in text and "VLLM::EngineCore" in text, text
    assert f"resumes from {os.path.join(checkpoints, 'global_step_2')}" in text, text


def test_a_dead_engine_inside_another_error_is_found(tmp_path):
    """As the trainer may meet it: raised while handling the server's error, or chained as its cause."""
    try:
        try:
            raise _from_server(EngineDeadError("dead"))
        except Exception as inner:
            raise RuntimeError("the weight sync failed") from inner
    except RuntimeError as outer:
        assert "ray::CPUvLLMHttpServer.abort_all_requests()" in str(engine_death(outer))


def _actor_died(class_name: str) -> ActorDiedError:
    """The ActorDiedError the one_off_pipeline trainer met in `make chaos --faults vllm_server_kill`, built as Ray
    builds it."""
    from ray.core.generated.common_pb2 import ActorDiedErrorContext

    context = ActorDiedErrorContext(class_name=class_name, actor_id=bytes.fromhex("35c85dda7bb91cc7e076a3f506000000"),
                                    pid=25073, name="vllm_server_0_0", ray_namespace="ca75ca9c",
                                    node_ip_address="192.0.2.2",
                                    error_message="The actor is dead because its worker process has died.")  # fmt: skip
    return ActorDiedError(context)


def test_a_dead_rollout_server_is_named_with_the_step_and_the_resume(tmp_path):
    checkpoints = _checkpoints(tmp_path, saved=4)
    with pytest.raises(RolloutReplicaDiedError) as caught:
        with diagnosing_dead_replicas(lambda: 5, checkpoints):
            raise _actor_died("CPUvLLMHttpServer")
    text = str(caught.value)
    assert text.startswith("The rollout server CPUvLLMHttpServer (actor vllm_server_0_0, pid 25073 on 192.0.2.2) "
                           "died during step 5"), text  # fmt: skip
    assert f"resumes from {os.path.join(checkpoints, 'global_step_4')}" in text, text


def test_control_any_other_error_passes_unchanged(tmp_path):
    checkpoints = _checkpoints(tmp_path, saved=1)
    other = _from_server(ValueError("a bad request"))
    with pytest.raises(ValueError) as caught:
        with diagnosing_dead_replicas(lambda: 3, checkpoints):
            raise other
    assert caught.value is other and engine_death(other) is None
    # another actor's death (a reward worker) is not a replica's
    assert server_death(_actor_died("RewardLoopWorker")) is None
