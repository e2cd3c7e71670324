"""The one compute_data_metrics hook: every registered contributor's metrics reach verl's step metrics."""

from __future__ import annotations


def test_contributors_add_to_verls_step_metrics_once_each():
    """Guards against one part's wrapper hiding another's (a second wrap was a silent no-op before)."""
    import verl.trainer.ppo.ray_trainer as ray_trainer  # noqa: F401 - the patch applies on this import

    from verl_pipe import step_metrics
    from verl_pipe.patching import is_patched

    calls = []

    def contributor(batch):
        calls.append(batch)
        return {"test/contributed": 1.0}

    step_metrics.add_contributor(contributor)
    step_metrics.add_contributor(contributor)  # registering twice must not count twice
    try:
        assert is_patched(ray_trainer.compute_data_metrics)
        wrapped = step_metrics._wrap(lambda batch, use_critic=True: {"verl/own": 2.0}, "step_metrics@ray_trainer")
        metrics = wrapped(batch="the-batch")  # other parts' contributors (GRPO+, rewards) may add theirs too
        assert metrics["verl/own"] == 2.0 and metrics["test/contributed"] == 1.0
        assert calls == ["the-batch"]
    finally:
        step_metrics._CONTRIBUTORS.remove(contributor)
