"""GRPO+ configuration: the one-line preset, start-up validation naming the key, the guarded patches."""

import os
import subprocess
import sys

import pytest
import verl
from hydra import compose, initialize_config_dir
from verl.trainer.ppo.utils import need_reference_policy
from verl.utils.config import omega_conf_to_dataclass

from verl_pipe.algorithms.config import GRPOPlusLossSettings, GRPOPlusPolicyLossConfig

PRESET = ["hydra.searchpath=[pkg://verl_pipe.config]", "+verl_pipe=grpo_plus"]
MICRO_BATCH = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"
CONFIG_DIR = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")


def composed(*overrides):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose("ppo_trainer", overrides=[*PRESET, MICRO_BATCH, *overrides])


def test_preset_turns_on_grpo_plus_in_verls_own_config():
    config = composed()
    assert config.algorithm.adv_estimator == "grpo_plus"
    actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    assert isinstance(actor.policy_loss, GRPOPlusPolicyLossConfig)
    assert actor.policy_loss.loss_mode == "grpo_plus"
    assert GRPOPlusLossSettings.from_actor_config(actor) == GRPOPlusLossSettings()
    assert actor.entropy_coeff == 0 and not actor.use_kl_loss
    # verl builds no reference model when neither KL loss nor KL-in-reward is on (its need_reference_policy)
    assert not need_reference_policy(config)
    assert config.actor_rollout_ref.rollout.calculate_log_probs
    # keys after the preset still override it
    assert composed("actor_rollout_ref.actor.clip_ratio_high=0.3").actor_rollout_ref.actor.clip_ratio_high == 0.3


@pytest.mark.parametrize(
    "override, key",
    [
        ("actor_rollout_ref.actor.clip_ratio_high=-0.1", "actor_rollout_ref.actor.clip_ratio_high"),
        ("actor_rollout_ref.actor.clip_ratio_low=1.0", "actor_rollout_ref.actor.clip_ratio_low"),
        ("actor_rollout_ref.actor.policy_loss.is_eps_low=1.5", "actor_rollout_ref.actor.policy_loss.is_eps_low"),
        ("actor_rollout_ref.actor.policy_loss.is_eps_high=0", "actor_rollout_ref.actor.policy_loss.is_eps_high"),
        ("actor_rollout_ref.actor.loss_agg_mode=token-median", "actor_rollout_ref.actor.loss_agg_mode"),
        ("actor_rollout_ref.actor.policy_loss.overlong_filter=some", "actor_rollout_ref.actor.policy_loss.overlong_filter"),
        ("actor_rollout_ref.actor.clip_ratio_c=0.5", "actor_rollout_ref.actor.clip_ratio_c"),
    ],
)
def test_bad_config_names_the_key(override, key):
    config = composed(override)
    with pytest.raises(Exception) as error:
        omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    assert key in str(error.value)


def test_bad_config_stops_verls_entry_point_at_start_up():
    """Through `python -m verl.trainer.main_ppo`: fails in validate_config, before Ray or any model starts."""
    result = subprocess.run(
        [sys.executable, "-m", "verl.trainer.main_ppo", *PRESET, "actor_rollout_ref.actor.clip_ratio_high=-0.1",
         "trainer.device=cpu"],
        env={**os.environ, "VERL_PLATFORM": "cpu"}, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode != 0
    # Hydra echoes the overrides on any failure (a valid clip_ratio_high=0.3 without a micro-batch size fails too):
    # what shows the validation ran is its own message, naming the key, the value and why.
    output = result.stdout + result.stderr
    assert "actor_rollout_ref.actor.clip_ratio_high=-0.1 is negative: the upper clip is 1 + clip_ratio_high" in output
    assert "ray.init" not in output and "Started a local Ray instance" not in output


def test_vanilla_configs_are_untouched():
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        config = compose("ppo_trainer", overrides=[MICRO_BATCH, "actor_rollout_ref.actor.clip_ratio_high=-0.1"])
    actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)  # verl's own rules only: no GRPO+ checks
    assert actor.clip_ratio_high == -0.1


def test_every_grpo_plus_patch_still_matches_verl_and_is_applied():
    import verl.trainer.ppo.ray_trainer  # noqa: F401 - the patches apply when verl imports these
    import verl.trainer.ppo.v1.trainer_base  # noqa: F401
    import verl.workers.engine_workers  # noqa: F401
    from verl.single_controller.base.decorator import MAGIC_ATTR
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn, get_policy_loss_fn
    from verl.workers import engine_workers

    from verl_pipe.patch_registry import PATCHES
    from verl_pipe.patching import STATUS, is_patched

    patches = [p for p in PATCHES if p.name.startswith(("grpo_plus", "step_metrics"))]
    assert len(patches) == 6
    assert all(patch.matches() for patch in patches), [p.name for p in patches if not p.matches()]
    assert all(STATUS.get(patch.name) == "applied" for patch in patches), STATUS
    assert get_adv_estimator_fn("grpo_plus") and get_policy_loss_fn("grpo_plus")
    update_actor = engine_workers.ActorRolloutRefWorker.update_actor
    assert is_patched(update_actor) and hasattr(update_actor, MAGIC_ATTR)  # verl's dispatch registration survives
    assert is_patched(engine_workers.ppo_loss)
    assert is_patched(verl.trainer.ppo.v1.trainer_base.compute_data_metrics)
    assert is_patched(verl.trainer.ppo.ray_trainer.compute_data_metrics)
