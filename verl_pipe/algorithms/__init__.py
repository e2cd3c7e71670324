"""GRPO+ and the off-policy corrections of pipelined training, registered into verl's algorithm registries.

Turn it on in any verl config with ``algorithm.adv_estimator=grpo_plus`` and
``actor_rollout_ref.actor.policy_loss.loss_mode=grpo_plus`` (or the preset, see docs/grpo_plus.md).

  config       typed settings and start-up validation
  advantage    the ``grpo_plus`` advantage estimator
  policy_loss  the ``grpo_plus`` policy loss (clip-high, dual clip, token-level IS mask)
  overlong     overlong filtering as a true loss mask
  filters      staleness and environment-failure sample filters for the pipelined trainers
  hooks        registration and the version-guarded patches of verl's call sites
"""
