"""The rollout side as verl-pipe extends it, on every platform: verl's vLLM server with in-flight weight loads,
per-token policy versions, prefix-cache salting, engine health and prefill accounting (:mod:`.vllm_server`, loaded
inside vLLM's workers by :mod:`.vllm_worker`), the gloo checkpoint engine, and the composition that says which
replica, server, checkpoint engine and client a run builds (:mod:`.composition`). The CPU backend
(:mod:`verl_pipe.backends.cpu`) subclasses these only for what a CPU host needs."""
