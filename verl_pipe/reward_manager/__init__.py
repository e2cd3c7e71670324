"""The reward *manager*: how verl's reward loop gets samples scored (the ``interleaved`` manager, its scoring
processes and the step metrics it feeds). What a sample scores is the reward itself, :mod:`verl_pipe.reward_score`."""
