"""The rollout classes a run builds, resolved from verl's own composed config for a GPU cluster (platform ``cuda``,
``rollout.name=vllm``, separate pools, ``checkpoint_engine.backend=nccl``) and for the CPU backend, and the
combinations that would fail once the workers are up, refused with the key and the fix.

Before this, ``in_flight_pipeline`` on a GPU cluster built verl's own ``vLLMReplica`` (the plugin registered its
extended replica only with ``VERL_PLATFORM=cpu``) and raised ``TypeError`` once every worker was up; the ``hf``
rollout on a GPU and the ``naive`` engine across pools also got past start-up. The classes are named, not imported,
so this runs without vLLM; the vLLM tier imports them (tests/rollout/test_gpu_composition_vllm_on_cpu.py).
"""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from verl_pipe.recipe_check import compose_config
from verl_pipe.rollout.composition import (
    CPU_HF,
    CPU_VLLM,
    IN_FLIGHT_MANAGER,
    PARTIAL_ROLLOUT_CLIENT,
    PIPE_VLLM,
    PLAIN_CLIENT,
    VERL_MANAGER,
    VERL_ROLLOUTS,
    VERSION_KEEPING_CLIENT,
    RolloutCompositionError,
    compose,
    platform_of,
)
from verl_pipe.trainer_modes import TRAINER_MODES, plugin_modes

@pytest.fixture(scope="module")
def gpu_configs() -> dict:
    """verl's composed config per mode, as a GPU recipe writes it (our modes through their presets: nccl)."""
    configs = {}
    for mode in TRAINER_MODES:
        if TRAINER_MODES[mode].from_plugin:
            overrides = ["hydra.searchpath=[pkg://verl_pipe.config]", f"+verl_pipe_trainer={mode}"]
        elif mode == "separate_async":
            overrides = ["trainer.use_v1=true", "trainer.v1.trainer_mode=separate_async",
                         "actor_rollout_ref.hybrid_engine=false",
                         "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl"]  # fmt: skip
        else:
            overrides = ["trainer.use_v1=true", "trainer.v1.trainer_mode=sync"]
        if TRAINER_MODES[mode].separate_pools:  # one node of 8 GPUs samples
            overrides.append("actor_rollout_ref.rollout.nnodes=1")
        configs[mode] = compose_config(overrides + ["actor_rollout_ref.rollout.name=vllm"])
    return configs


def _with(config, **keys):
    changed = OmegaConf.create(OmegaConf.to_container(config))
    for key, value in keys.items():
        OmegaConf.update(changed, key.replace("__", "."), value, force_add=True)
    return changed


def test_on_a_gpu_our_modes_build_verls_vllm_server_with_the_extension(gpu_configs, monkeypatch):
    monkeypatch.delenv("VERL_PLATFORM", raising=False)
    for mode in plugin_modes():
        composed = compose(gpu_configs[mode])
        assert composed.platform == "cuda" and composed.separate_pools and composed.checkpoint_engine == "nccl"
        assert (composed.replica, composed.server) == PIPE_VLLM, mode
        assert "backends.cpu" not in composed.replica + composed.server
        assert composed.checkpoint_engine_cls.endswith("nccl_checkpoint_engine:NCCLCheckpointEngine")
        if mode == "in_flight_pipeline":
            assert composed.in_flight_loads
            assert (composed.checkpoint_manager, composed.llm_client) == (IN_FLIGHT_MANAGER, VERSION_KEEPING_CLIENT)
        else:
            assert not composed.in_flight_loads
            assert (composed.checkpoint_manager, composed.llm_client) == (VERL_MANAGER, PARTIAL_ROLLOUT_CLIENT)


def test_verls_own_modes_keep_verls_own_classes(gpu_configs, monkeypatch):
    monkeypatch.delenv("VERL_PLATFORM", raising=False)
    sync, separate = compose(gpu_configs["sync"]), compose(gpu_configs["separate_async"])
    assert (sync.replica, sync.server) == VERL_ROLLOUTS["vllm"] == (separate.replica, separate.server)
    assert (sync.checkpoint_manager, sync.llm_client) == (VERL_MANAGER, PLAIN_CLIENT)
    assert sync.checkpoint_engine == "naive" and not sync.separate_pools  # colocated: naive is right there
    assert separate.llm_client == PARTIAL_ROLLOUT_CLIENT and not separate.in_flight_loads


def test_the_cpu_backend_builds_its_placement_subclass_in_every_mode(gpu_configs, monkeypatch):
    monkeypatch.setenv("VERL_PLATFORM", "cpu")
    for mode, config in gpu_configs.items():
        config = _with(config, actor_rollout_ref__rollout__checkpoint_engine__backend="gloo") \
            if TRAINER_MODES[mode].separate_pools else config  # fmt: skip
        composed = compose(config)
        assert composed.platform == "cpu" and (composed.replica, composed.server) == CPU_VLLM, mode
    assert (compose(_with(gpu_configs["in_flight_pipeline"], actor_rollout_ref__rollout__name="hf",
                          actor_rollout_ref__rollout__checkpoint_engine__backend="gloo")).replica
            == CPU_HF[0])  # fmt: skip


def test_the_platform_is_the_cpu_backend_or_verls_device(gpu_configs, monkeypatch):
    monkeypatch.delenv("VERL_PLATFORM", raising=False)
    config = gpu_configs["sync"]
    assert platform_of(config) == "cuda"
    assert platform_of(_with(config, trainer__device="cpu")) == "cpu"
    assert platform_of(_with(config, trainer__device="npu")) == "npu"
    monkeypatch.setenv("VERL_PLATFORM", "cpu")
    assert platform_of(config) == "cpu"


@pytest.mark.parametrize(("change", "platform", "key", "says"), [
    # verl's SGLang server cannot load in flight (today: TypeError once every worker was up)
    ({"actor_rollout_ref__rollout__name": "sglang"}, "cuda", "actor_rollout_ref.rollout.name",
     "the 'sglang' rollout cannot do yet: set actor_rollout_ref.rollout.name=vllm"),
    # the hf server has no GPU path (today: it started, on CPU threads of a GPU node)
    ({"actor_rollout_ref__rollout__name": "hf"}, "cuda", "actor_rollout_ref.rollout.name",
     "has no cuda path: set actor_rollout_ref.rollout.name=vllm"),
    # naive across pools (the presets set nccl; a user's override put it back)
    ({"actor_rollout_ref__rollout__checkpoint_engine__backend": "naive"}, "cuda",
     "actor_rollout_ref.rollout.checkpoint_engine.backend",
     "set actor_rollout_ref.rollout.checkpoint_engine.backend=nccl"),
    ({"actor_rollout_ref__rollout__checkpoint_engine__backend": "naive"}, "cpu",
     "actor_rollout_ref.rollout.checkpoint_engine.backend", "backend=gloo (the CPU backend)"),
    ({"actor_rollout_ref__rollout__disaggregation__enabled": True}, "cuda",
     "actor_rollout_ref.rollout.disaggregation.enabled", "vLLMPDReplica) has no in-flight loads"),
    ({"actor_rollout_ref__rollout__checkpoint_engine__backend": "delta_sharded"}, "cuda",
     "actor_rollout_ref.rollout.checkpoint_engine.backend", "use nccl"),
])  # fmt: skip
def test_a_combination_that_fails_after_start_up_is_refused_naming_the_key(gpu_configs, change, platform, key, says):
    with pytest.raises(RolloutCompositionError) as refused:
        compose(_with(gpu_configs["in_flight_pipeline"], **change), platform=platform)
    assert refused.value.key == key and says in str(refused.value), str(refused.value)


def test_one_off_pipeline_runs_any_rollout_that_syncs_between_batches(gpu_configs):
    """The control of the sglang refusal: only in-flight loads need the extension."""
    composed = compose(_with(gpu_configs["one_off_pipeline"], actor_rollout_ref__rollout__name="sglang"), "cuda")
    assert (composed.replica, composed.server) == VERL_ROLLOUTS["sglang"]


def test_the_trainers_refuse_at_config_time_through_their_layout_checks(gpu_configs):
    """The trainer's constructor runs these checks before verl builds a worker (the dry run runs them too)."""
    from verl_pipe.trainers.config import PipelineConfig, PipelineConfigError
    from verl_pipe.trainers.layout_checks import check_layout

    config = _with(gpu_configs["in_flight_pipeline"], actor_rollout_ref__rollout__name="sglang")
    with pytest.raises(PipelineConfigError, match="the 'sglang' rollout cannot do yet"):
        check_layout("in_flight_pipeline", PipelineConfig(), config)
