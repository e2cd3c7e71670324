"""The grpo_plus advantage estimator: hand numbers, parity with verl's grpo, degenerate groups."""

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage, get_adv_estimator_fn

from verl_pipe.algorithms.advantage import drain_advantage_metrics


def rewards_at_last_token(scores, lengths, width=5):
    rewards = torch.zeros(len(scores), width)
    mask = torch.zeros(len(scores), width)
    for row, (score, length) in enumerate(zip(scores, lengths)):
        mask[row, :length] = 1
        if length:
            rewards[row, length - 1] = score
    return rewards, mask


def run(scores, index, lengths=None, **algorithm):
    lengths = lengths or [3] * len(scores)
    rewards, mask = rewards_at_last_token(scores, lengths)
    config = OmegaConf.create({"norm_adv_by_std_in_grpo": True, **algorithm})
    advantages, returns = get_adv_estimator_fn("grpo_plus")(
        token_level_rewards=rewards, response_mask=mask, config=config, index=np.array(index, dtype=object)
    )
    return advantages, returns, mask


def test_hand_numbers_with_and_without_std():
    advantages, returns, mask = run([1.0, 0.0, 0.0, 1.0], ["a"] * 4)
    std = float(np.std([1, 0, 0, 1], ddof=1))
    expected = torch.tensor([0.5, -0.5, -0.5, 0.5]) / (std + 1e-6)
    assert torch.allclose(advantages[:, 0], expected, atol=1e-6)
    assert torch.equal(advantages, returns)
    assert torch.equal(advantages * (1 - mask), torch.zeros_like(advantages))  # only on response tokens
    assert torch.allclose(advantages[:, :3], expected.unsqueeze(1).expand(4, 3))  # broadcast over the response

    advantages, _, _ = run([1.0, 0.0, 0.0, 1.0], ["a"] * 4, norm_adv_by_std_in_grpo=False)
    assert torch.allclose(advantages[:, 0], torch.tensor([0.5, -0.5, -0.5, 0.5]))


@pytest.mark.parametrize("norm", [True, False])
def test_matches_verl_grpo_on_non_degenerate_groups(norm):
    generator = torch.Generator().manual_seed(0)
    scores = torch.rand(12, generator=generator).tolist()
    index = [f"g{i // 4}" for i in range(12)]
    lengths = torch.randint(1, 6, (12,), generator=generator).tolist()
    ours, _, mask = run(scores, index, lengths, norm_adv_by_std_in_grpo=norm)
    rewards, _ = rewards_at_last_token(scores, lengths)
    verls, _ = compute_grpo_outcome_advantage(rewards, mask, np.array(index, dtype=object), norm_adv_by_std_in_grpo=norm)
    assert torch.allclose(ours, verls, atol=1e-5)


def test_degenerate_groups_are_exactly_zero_and_counted():
    drain_advantage_metrics()
    scores = [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.7]
    index = ["solved", "solved", "solved", "unsolved", "unsolved", "unsolved", "mixed", "mixed", "single"]
    advantages, _, _ = run(scores, index)
    assert torch.count_nonzero(advantages[:6]) == 0
    assert torch.count_nonzero(advantages[8]) == 0  # a group of one has no baseline
    assert torch.count_nonzero(advantages[6:8]) > 0
    metrics = drain_advantage_metrics()
    assert metrics["grpo_plus/groups_total"] == 4
    assert metrics["grpo_plus/groups_degenerate"] == 3
    assert metrics["grpo_plus/groups_degenerate_frac"] == pytest.approx(0.75)
    assert drain_advantage_metrics() == {}


def test_epsilon_is_configurable_and_checked():
    big, _, _ = run([1.0, 0.0], ["a", "a"], grpo_plus={"epsilon": 1.0})
    std = float(np.std([1, 0], ddof=1))
    assert big[0, 0].item() == pytest.approx(0.5 / (std + 1.0))
    with pytest.raises(ValueError, match=r"algorithm\.grpo_plus\.epsilon"):
        run([1.0, 0.0], ["a", "a"], grpo_plus={"epsilon": 0.0})
    with pytest.raises(ValueError, match=r"algorithm\.grpo_plus\.epsilonn"):
        run([1.0, 0.0], ["a", "a"], grpo_plus={"epsilonn": 1e-6})


def test_missing_group_ids_name_the_fix():
    rewards, mask = rewards_at_last_token([1.0], [2])
    with pytest.raises(ValueError, match="uid"):
        get_adv_estimator_fn("grpo_plus")(token_level_rewards=rewards, response_mask=mask, config=None)
