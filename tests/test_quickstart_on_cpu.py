"""The quickstart's pieces that need no training run: its overrides against verl's real config schema, and the
per-step summaries built from verl's own log formats."""

from __future__ import annotations

import json
import os

import pytest

from verl_pipe.quickstart import QuickstartConfig, training_overrides
from verl_pipe.run_metrics import VerlMetricsTail, summarize_step


def _compose(overrides: list[str]):
    import verl.trainer.main_ppo as main_ppo
    from hydra import compose, initialize_config_dir

    config_dir = os.path.join(os.path.dirname(main_ppo.__file__), "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


@pytest.mark.parametrize("trainer,ranks", [("v1", 1), ("legacy", 2)])
def test_overrides_compose_against_verls_schema(trainer, ranks):
    """Guards: a misspelt key, which hydra rejects only after the user has waited for start-up."""
    cfg = QuickstartConfig(trainer=trainer, ranks=ranks, overrides=["trainer.total_training_steps=5"])
    assert cfg.steps == 5, "a hydra override of the step count is the step count"
    composed = _compose(training_overrides(cfg, "/models/m", "/d/train.parquet", "/d/val.parquet", "/runs/r"))
    assert composed.trainer.device == "cpu" and composed.trainer.n_gpus_per_node == ranks
    assert composed.trainer.use_v1 is (trainer == "v1")
    assert composed.trainer.total_training_steps == 5  # the user's override comes last and wins
    assert composed.actor_rollout_ref.rollout.name == "hf"
    assert composed.actor_rollout_ref.rollout.tensor_model_parallel_size == 1
    assert composed.actor_rollout_ref.actor.strategy == "fsdp2"
    assert composed.actor_rollout_ref.model.override_config.attn_implementation == "sdpa"
    assert composed.reward.custom_reward_function.path == "pkg://verl_pipe.reward_score"
    assert composed.transfer_queue.backend.SimpleStorage.num_data_storage_units == 1


def test_ray_address_replaces_num_cpus():
    cfg = QuickstartConfig(ray_address="127.0.0.1:6379")
    composed = _compose(training_overrides(cfg, "/m", "/t.parquet", "/v.parquet", "/r"))
    assert composed.ray_kwargs.ray_init.address == "127.0.0.1:6379"
    assert composed.ray_kwargs.ray_init.num_cpus is None  # Ray refuses num_cpus when joining a cluster
    assert composed.ray_kwargs.ray_init.runtime_env.env_vars.VERL_PLATFORM == "cpu"


def test_step_summary_from_verl_log_formats(tmp_path):
    """Summaries read the exact shapes verl writes: FileLogger lines and rollout_data_dir dumps."""
    log = tmp_path / "verl_metrics.jsonl"
    data = {
        "critic/score/mean": 0.25,
        "response_length/mean": 120.0,
        "response_length/clip_ratio": 0.5,
        "timing_s/gen": 3.0,
        "timing_s/update_actor": 2.0,
        "timing_s/step": 5.5,
    }
    log.write_text(json.dumps({"step": 1, "data": data}) + "\n" + '{"step": 2, "da')  # second line still being written
    dump = tmp_path / "1.jsonl"
    outputs = ["```python\nprint(1)\n```", "no code here", "```python\nprint(2)\n```", "```py\nx\n```"]
    dump.write_text(
        "".join(json.dumps({"output": o, "score": s, "step": 1}) + "\n" for o, s in zip(outputs, [1.0, 0.0, 0.0, 1.0]))
    )

    tail = VerlMetricsTail(str(log))
    records = tail.poll()
    assert [step for step, _ in records] == [1]
    summary = summarize_step(1, records[0][1], str(dump))
    assert summary.pass_rate == 0.5 and summary.format_rate == 0.75
    assert summary.phases_s == {"gen": 3.0, "update_actor": 2.0, "step": 5.5}
    assert "pass   50%" in summary.line() and "format   75%" in summary.line()

    with open(log, "a") as fh:
        fh.write('ta": {"timing_s/step": 1.0}}\n')
    assert [step for step, _ in tail.poll()] == [2]  # the partial line is completed, not lost or duplicated
