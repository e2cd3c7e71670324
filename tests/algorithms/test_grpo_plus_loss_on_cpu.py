"""The GRPO+ policy loss: parity with verl's vanilla loss, the rllm#81 regression, masks, IS correction."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla, get_policy_loss_fn

from verl_pipe.algorithms.config import GRPOPlusLossSettings
from verl_pipe.algorithms.policy_loss import grpo_plus_policy_loss, rollout_log_probs_for_loss

NO_IS = GRPOPlusLossSettings(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0, is_correction=False)


def random_batch(generator, bs=6, length=9, spread=0.6, dtype=torch.float64):
    old = -torch.rand(bs, length, generator=generator, dtype=dtype) * 3
    new = old + (torch.rand(bs, length, generator=generator, dtype=dtype) - 0.5) * 2 * spread
    advantages = torch.randn(bs, 1, generator=generator, dtype=dtype).expand(bs, length).clone()
    lengths = torch.randint(0, length + 1, (bs,), generator=generator)
    mask = torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)
    mask[0, :3] = True  # never an empty batch
    return new.requires_grad_(True), old, advantages, mask


def loss_and_grad(fn, log_prob, *args, **kwargs):
    log_prob = log_prob.detach().clone().requires_grad_(True)
    loss, metrics = fn(log_prob, *args, **kwargs)
    loss.backward()
    return loss.detach(), log_prob.grad, metrics


@pytest.mark.parametrize("batch_info", [{}, {"dp_size": 1, "batch_num_tokens": 40, "global_batch_size": 8}])
def test_equals_verl_vanilla_token_mean(actor_config, generator, batch_info):
    config = actor_config()
    config.global_batch_info.update(batch_info)
    new, old, advantages, mask = random_batch(generator)

    def vanilla(log_prob):
        return compute_policy_loss_vanilla(
            old_log_prob=old, log_prob=log_prob, advantages=advantages, response_mask=mask,
            loss_agg_mode="token-mean", config=config,
        )

    def ours(log_prob):
        return grpo_plus_policy_loss(
            log_prob, old, advantages, mask, NO_IS, loss_agg_mode="token-mean", global_batch_info=batch_info
        )

    v_loss, v_grad, v_metrics = loss_and_grad(vanilla, new)
    o_loss, o_grad, o_metrics = loss_and_grad(ours, new)
    assert torch.allclose(o_loss, v_loss, atol=1e-6, rtol=0)
    assert torch.allclose(o_grad, v_grad, atol=1e-6, rtol=0)
    assert o_grad.abs().sum() > 0
    for name in ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"):
        assert o_metrics[name] == pytest.approx(v_metrics[name], abs=1e-6)


def test_registered_loss_reads_verl_actor_config(actor_config, generator):
    """Called the way verl's ppo_loss calls it: the clip ratios come from the actor config."""
    config = actor_config(clip_ratio_high=0.1)
    new, old, advantages, mask = random_batch(generator, spread=0.8)
    registered = get_policy_loss_fn("grpo_plus")
    ours, _ = registered(old_log_prob=old, log_prob=new, advantages=advantages, response_mask=mask,
                         loss_agg_mode="token-mean", config=config)
    vanilla, _ = compute_policy_loss_vanilla(old_log_prob=old, log_prob=new, advantages=advantages,
                                             response_mask=mask, loss_agg_mode="token-mean", config=config)
    assert torch.allclose(ours, vanilla, atol=1e-6)


def test_rllm81_clip_high_gives_zero_gradient():
    """rllm#81: the loss averaged the unclipped surrogate, so clip-high never acted. It must act."""
    old = torch.log(torch.tensor([[0.2, 0.2, 0.2, 0.2]], dtype=torch.float64))
    # ratios 1.5 (past 1 + 0.28), 1.1 (inside), 0.5 (below 1 - 0.2), 1.0
    ratios = torch.tensor([[1.5, 1.1, 0.5, 1.0]], dtype=torch.float64)
    mask = torch.ones(1, 4, dtype=torch.bool)
    positive = torch.ones(1, 4, dtype=torch.float64)
    loss, grad, metrics = loss_and_grad(
        lambda lp: grpo_plus_policy_loss(lp, old, positive, mask, NO_IS), old + torch.log(ratios)
    )
    assert grad[0, 0] == 0.0, "a positive-advantage token past 1 + clip_ratio_high must get no gradient"
    assert grad[0, 1] != 0.0 and grad[0, 2] != 0.0 and grad[0, 3] != 0.0
    assert metrics["actor/grpo_plus/clipfrac_high"] == pytest.approx(0.25)
    # the same token with a negative advantage is not clipped from above (it is pushed back down)
    _, grad_negative, metrics_negative = loss_and_grad(
        lambda lp: grpo_plus_policy_loss(lp, old, -positive, mask, NO_IS), old + torch.log(ratios)
    )
    assert grad_negative[0, 0] != 0.0 and grad_negative[0, 2] == 0.0
    assert metrics_negative["actor/grpo_plus/clipfrac_low"] == pytest.approx(0.25)


def test_dual_clip_caps_negative_advantage_tokens():
    old = torch.zeros(1, 2, dtype=torch.float64)
    log_prob = torch.log(torch.tensor([[5.0, 2.0]], dtype=torch.float64))  # ratio 5 > c = 3; ratio 2 < c
    mask = torch.ones(1, 2, dtype=torch.bool)
    advantages = -torch.ones(1, 2, dtype=torch.float64)
    loss, grad, metrics = loss_and_grad(lambda lp: grpo_plus_policy_loss(lp, old, advantages, mask, NO_IS), log_prob)
    assert loss.item() == pytest.approx((3.0 + 2.0) / 2)
    assert grad[0, 0] == 0.0 and grad[0, 1] != 0.0
    assert metrics["actor/grpo_plus/dual_clipfrac"] == pytest.approx(0.5)
    no_dual = GRPOPlusLossSettings(clip_ratio_c=None, is_correction=False)
    loss_no_dual, _, _ = loss_and_grad(lambda lp: grpo_plus_policy_loss(lp, old, advantages, mask, no_dual), log_prob)
    assert loss_no_dual.item() == pytest.approx((5.0 + 2.0) / 2)


def test_masked_tokens_leave_numerator_and_denominator():
    """Hand numbers: 2 kept tokens with loss -1 each; 4 masked tokens. token-mean is -2/2, not -2/6."""
    log_prob = torch.zeros(2, 4, dtype=torch.float64)
    advantages = torch.ones(2, 4, dtype=torch.float64)
    full = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    kept = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)
    loss_full, _ = grpo_plus_policy_loss(log_prob, log_prob, advantages, full, NO_IS,
                                         global_batch_info={"dp_size": 1, "batch_num_tokens": int(full.sum())})
    loss_kept, _ = grpo_plus_policy_loss(log_prob, log_prob, advantages, kept, NO_IS,
                                         global_batch_info={"dp_size": 1, "batch_num_tokens": int(kept.sum())})
    assert loss_full.item() == pytest.approx(-6 / 6)
    assert loss_kept.item() == pytest.approx(-2 / 2)
    # the zero-advantage way (rllm's original) leaves the truncated tokens in the denominator
    zero_adv = advantages.clone()
    zero_adv[1] = 0
    loss_zero_adv, _ = grpo_plus_policy_loss(log_prob, log_prob, zero_adv, full, NO_IS,
                                             global_batch_info={"dp_size": 1, "batch_num_tokens": 6})
    assert loss_zero_adv.item() == pytest.approx(-2 / 6)


@pytest.mark.parametrize("mode", ["token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum",
                                  "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("batch_num_tokens", [None, 0, 12])
def test_all_masked_micro_batch_gives_zero_not_nan(mode, batch_num_tokens):
    log_prob = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    mask = torch.zeros(3, 5, dtype=torch.bool)  # includes zero-length responses: every row is empty
    info = {} if batch_num_tokens is None else {"dp_size": 1, "batch_num_tokens": batch_num_tokens,
                                                "global_batch_size": None if batch_num_tokens == 0 else 3}
    loss, metrics = grpo_plus_policy_loss(log_prob, log_prob.detach() + 0.1, torch.ones(3, 5, dtype=torch.float64),
                                          mask, NO_IS, loss_agg_mode=mode, global_batch_info=info)
    assert loss.item() == 0.0 and math.isfinite(loss.item())
    loss.backward()
    assert torch.equal(log_prob.grad, torch.zeros_like(log_prob))
    assert all(math.isfinite(v) for v in metrics.values())


def test_is_correction_masks_tokens_outside_the_rollout_interval():
    settings = GRPOPlusLossSettings(is_correction=True, is_eps_low=0.2, is_eps_high=0.28)
    old = torch.zeros(1, 4, dtype=torch.float64)
    log_prob = torch.zeros(1, 4, dtype=torch.float64)
    # pi_theta / pi_rollout: 1.0 (kept), 1.5 (above), 0.5 (below), 1.2 (kept)
    rollout = -torch.log(torch.tensor([[1.0, 1.5, 0.5, 1.2]], dtype=torch.float64))
    advantages = torch.ones(1, 4, dtype=torch.float64)
    mask = torch.ones(1, 4, dtype=torch.bool)
    loss, grad, metrics = loss_and_grad(
        lambda lp: grpo_plus_policy_loss(lp, old, advantages, mask, settings, rollout_log_prob=rollout), log_prob
    )
    assert grad[0, 1] == 0.0 and grad[0, 2] == 0.0
    assert grad[0, 0] != 0.0 and grad[0, 3] != 0.0
    assert loss.item() == pytest.approx(-2 / 4)  # masked tokens contribute zero but stay in the denominator
    assert metrics["actor/grpo_plus/is_masked_frac"] == pytest.approx(0.5)
    assert metrics["actor/grpo_plus/approx_kl_rollout_old"] > 0
    # with the correction off, the same call is plain GRPO+
    off = GRPOPlusLossSettings(is_correction=False)
    loss_off, _ = grpo_plus_policy_loss(log_prob, old, advantages, mask, off, rollout_log_prob=rollout)
    assert loss_off.item() == pytest.approx(-1.0)


def test_registered_loss_takes_rollout_log_probs_from_the_hook(actor_config):
    config = actor_config()
    old = torch.zeros(1, 2)
    mask = torch.ones(1, 2, dtype=torch.bool)
    advantages = torch.ones(1, 2)
    registered = get_policy_loss_fn("grpo_plus")
    with rollout_log_probs_for_loss(torch.tensor([[0.0, 2.0]])):  # second token: ratio e^-2, masked
        loss, metrics = registered(old_log_prob=old, log_prob=old.clone(), advantages=advantages,
                                   response_mask=mask, loss_agg_mode="token-mean", config=config)
    assert metrics["actor/grpo_plus/is_masked_frac"] == pytest.approx(0.5)
    assert loss.item() == pytest.approx(-0.5)
    with pytest.raises(ValueError, match="do not align"):
        with rollout_log_probs_for_loss(torch.zeros(1, 3)):
            registered(old_log_prob=old, log_prob=old.clone(), advantages=advantages, response_mask=mask,
                       loss_agg_mode="token-mean", config=config)


def test_finite_difference_gradient():
    """Analytic gradient against central differences, ratios kept away from the clip boundaries."""
    old = torch.log(torch.tensor([[0.3, 0.5, 0.2], [0.6, 0.1, 0.4]], dtype=torch.float64))
    ratios = torch.tensor([[1.05, 1.5, 0.95], [0.6, 1.1, 1.0]], dtype=torch.float64)
    advantages = torch.tensor([[0.7, 0.7, 0.7], [-1.3, -1.3, -1.3]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    rollout = old + torch.log(torch.tensor([[1.0, 0.9, 1.3], [1.0, 1.0, 1.0]], dtype=torch.float64))
    settings = GRPOPlusLossSettings(is_correction=True)

    def loss_of(log_prob):
        return grpo_plus_policy_loss(log_prob, old, advantages, mask, settings, rollout_log_prob=rollout)[0]

    assert torch.autograd.gradcheck(loss_of, (old + torch.log(ratios)).requires_grad_(True), eps=1e-6, atol=1e-8)


# --- properties over random masks, ratios and advantages --------------------------------------------------

batches = st.tuples(st.integers(1, 5), st.integers(1, 7), st.integers(0, 2**31 - 1), st.floats(0.0, 1.5))


@settings(max_examples=60, deadline=None)
@given(batches)
def test_property_parity_with_vanilla(batch):
    bs, length, seed, spread = batch
    generator = torch.Generator().manual_seed(seed)
    new, old, advantages, mask = random_batch(generator, bs=bs, length=length, spread=spread)
    from verl.workers.config.actor import FSDPActorConfig

    config = FSDPActorConfig(strategy="fsdp2", rollout_n=1, ppo_mini_batch_size=1, ppo_micro_batch_size_per_gpu=1,
                             clip_ratio_low=0.2, clip_ratio_high=0.28)
    v_loss, v_grad, _ = loss_and_grad(lambda lp: compute_policy_loss_vanilla(
        old_log_prob=old, log_prob=lp, advantages=advantages, response_mask=mask, config=config), new)
    o_loss, o_grad, _ = loss_and_grad(lambda lp: grpo_plus_policy_loss(lp, old, advantages, mask, NO_IS), new)
    assert torch.allclose(o_loss, v_loss, atol=1e-6) and torch.allclose(o_grad, v_grad, atol=1e-6)


@settings(max_examples=60, deadline=None)
@given(batches, st.booleans())
def test_property_masked_and_clipped_tokens_get_no_gradient(batch, with_rollout):
    bs, length, seed, spread = batch
    generator = torch.Generator().manual_seed(seed)
    new, old, advantages, mask = random_batch(generator, bs=bs, length=length, spread=spread)
    rollout = old + (torch.rand(old.shape, generator=generator, dtype=old.dtype) - 0.5) if with_rollout else None
    settings_ = GRPOPlusLossSettings(is_correction=True)
    loss, grad, metrics = loss_and_grad(
        lambda lp: grpo_plus_policy_loss(lp, old, advantages, mask, settings_, rollout_log_prob=rollout), new
    )
    assert math.isfinite(loss.item()) and all(math.isfinite(v) for v in metrics.values())
    ratio = torch.exp(new.detach() - old)
    clipped_up = (advantages > 0) & (ratio > 1.28)
    clipped_down = (advantages < 0) & (ratio < 0.8)
    assert torch.all(grad[~mask] == 0)
    assert torch.all(grad[clipped_up | clipped_down] == 0)
    if rollout is not None:
        is_ratio = torch.exp(new.detach() - rollout)
        assert torch.all(grad[(is_ratio <= 0.8) | (is_ratio >= 1.28)] == 0)
    # values under the mask never change the loss
    perturbed = new.detach().clone()
    perturbed[~mask] += 5.0
    loss_perturbed, _ = grpo_plus_policy_loss(perturbed, old, advantages, mask, settings_, rollout_log_prob=rollout)
    assert torch.allclose(loss_perturbed, loss, atol=1e-12)
