import pytest
import torch


@pytest.fixture
def actor_config():
    """verl's real FSDP actor config, as the worker builds it, with GRPO+'s clip ratios."""
    from verl.workers.config.actor import FSDPActorConfig

    def build(**overrides):
        fields = dict(
            strategy="fsdp2",
            rollout_n=4,
            ppo_mini_batch_size=4,
            ppo_micro_batch_size_per_gpu=2,
            clip_ratio_low=0.2,
            clip_ratio_high=0.28,
        )
        fields.update(overrides)
        return FSDPActorConfig(**fields)

    return build


@pytest.fixture
def generator():
    return torch.Generator().manual_seed(1234)
