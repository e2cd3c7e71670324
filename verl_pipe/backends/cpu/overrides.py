"""The hydra overrides that put an existing verl config on the CPU backend.

These are the knobs, and only the knobs, that differ from a GPU run: device and collectives, FSDP2 (FSDP1 needs
an accelerator), SDPA attention (flash-attention is CUDA-only), the ``hf`` rollout with one process per replica
(or verl's own vLLM rollout on vLLM's CPU build, ``rollout="vllm"``, in eager mode), and Ray sizing that places
on a 2-core machine (Ray CPUs are logical, so over-subscription is safe; one TransferQueue storage unit instead
of eight), and a job that shares its cores well: Ray workers at the driver's priority and OpenMP threads that
sleep rather than spin while they wait (see :class:`CpuBackendConfig`). Everything else in the user's config is
left alone.

With ``sampler_ranks`` set, the list also lays out a separate rollout pool for the trainer modes that keep samplers
and trainer apart (verl's ``separate_async``, verl-pipe's ``one_off_pipeline`` / ``minibatch_pipeline``), with the
plugin's ``gloo`` checkpoint engine between the pools: verl's ``naive`` engine only reaches rollout workers in the
trainer's own processes, and ``nccl`` needs GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


ROLLOUT_ENGINES = ("hf", "vllm")


@dataclass(frozen=True)
class CpuBackendConfig:
    # Trainer ranks (FSDP2 over gloo); each becomes one rollout replica in colocated (hybrid) mode.
    ranks: int = 1
    # Ranks of a separate rollout (sampler) pool. 0: no such pool; the rollout replicas live in the trainer ranks
    # (hybrid engine) and the pool and weight-sync keys of the user's config are left alone.
    sampler_ranks: int = 0
    # Logical CPUs Ray advertises: enough for every actor verl starts, whatever the real core count.
    ray_num_cpus: int = 16
    # Agent-loop and reward-loop actors; one of each is plenty for a CPU run and keeps start-up short.
    agent_workers: int = 1
    reward_workers: int = 1
    # Join an existing cluster (``ray start --head`` with VERL_PLATFORM=cpu in its environment) instead of
    # starting one; Ray then refuses num_cpus, so it is not passed.
    ray_address: Optional[str] = None
    # The rollout engine: "hf" (the plugin's HF-transformers server, no extra install) or "vllm" (verl's vLLM
    # rollout; needs vLLM's CPU build, ``make install-vllm``).
    rollout: str = "hf"
    # Torch (OpenMP) threads of every actor of the job. None: Ray's default, which pins each actor that asks for
    # no more than one logical CPU (all of verl's on this backend) to a single thread, so a colocated trainer
    # trains on one core of two while the idle sampler holds the other.
    torch_threads: Optional[int] = None
    # OpenMP's wait policy in every actor of the job. PASSIVE: a thread that waits at a barrier sleeps instead of
    # spinning. With the default (spin first), one process beside a 2-thread trainer on 2 cores turned a training
    # micro-step from 2.5 s into 18.6 s (a convoy of spinning waiters); PASSIVE made it 4.1 s, at 11% more idle.
    # None: OpenMP's default.
    omp_wait_policy: Optional[str] = "PASSIVE"
    # Niceness of the Ray workers of a cluster the job starts (ray.init's _system_config). Ray's default, 15, puts
    # the whole run below any ordinary process on the box: one busy loop beside the demo made its first training
    # step 5x slower. 0: the driver's priority. None: Ray's default. Not passed when joining a cluster (ray_address).
    worker_niceness: Optional[int] = 0

    def validate(self) -> None:
        if self.rollout not in ROLLOUT_ENGINES:
            raise ValueError(
                f"rollout must be one of {', '.join(ROLLOUT_ENGINES)}, got {self.rollout!r} "
                "(actor_rollout_ref.rollout.name)"
            )
        if self.ranks < 1:
            raise ValueError(f"ranks must be >= 1, got {self.ranks} (trainer.n_gpus_per_node on the CPU backend)")
        if self.sampler_ranks < 0:
            raise ValueError(
                f"sampler_ranks must be >= 0, got {self.sampler_ranks} "
                "(actor_rollout_ref.rollout.n_gpus_per_node of a separate rollout pool; 0: colocated)"
            )
        if self.torch_threads is not None and self.torch_threads < 1:
            raise ValueError(f"torch_threads must be >= 1, got {self.torch_threads} (OMP_NUM_THREADS of the actors)")
        if self.omp_wait_policy is not None and self.omp_wait_policy.upper() not in ("ACTIVE", "PASSIVE"):
            raise ValueError(
                f"omp_wait_policy must be ACTIVE or PASSIVE, got {self.omp_wait_policy!r} (OMP_WAIT_POLICY of the actors)"
            )
        if self.worker_niceness is not None and not 0 <= self.worker_niceness <= 19:
            raise ValueError(
                f"worker_niceness must be 0-19, got {self.worker_niceness} (ray_kwargs.ray_init._system_config."
                "worker_niceness)"
            )
        needed = self.ranks + self.sampler_ranks + 4
        if self.ray_num_cpus < needed:
            raise ValueError(
                f"ray_num_cpus={self.ray_num_cpus} cannot place {self.ranks} trainer and {self.sampler_ranks} "
                f"sampler ranks plus verl's service actors: use at least {needed}"
            )


def cpu_backend_overrides(cfg: CpuBackendConfig = CpuBackendConfig()) -> list[str]:
    cfg.validate()
    return [
        "trainer.device=cpu",
        "trainer.nnodes=1",
        f"trainer.n_gpus_per_node={cfg.ranks}",
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.ref.strategy=fsdp2",
        "critic.strategy=fsdp2",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "+critic.model.override_config.attn_implementation=sdpa",  # only read when a critic is used (GAE)
        f"actor_rollout_ref.rollout.name={cfg.rollout}",
        # Eager mode is what this backend runs and tests; vLLM's compiled CPU path is untested here.
        *(["actor_rollout_ref.rollout.enforce_eager=True"] if cfg.rollout == "vllm" else []),
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        f"actor_rollout_ref.rollout.agent.num_workers={cfg.agent_workers}",
        f"reward.num_workers={cfg.reward_workers}",
        *(
            [
                f"+ray_kwargs.ray_init.address={cfg.ray_address}",
                # Workers of an existing cluster do not inherit this driver's environment.
                "+ray_kwargs.ray_init.runtime_env.env_vars.VERL_PLATFORM=cpu",
            ]
            if cfg.ray_address
            else [
                f"ray_kwargs.ray_init.num_cpus={cfg.ray_num_cpus}",
                *(
                    [f"+ray_kwargs.ray_init._system_config.worker_niceness={cfg.worker_niceness}"]
                    if cfg.worker_niceness is not None
                    else []
                ),
            ]
        ),
        *(
            # quoted: Ray takes environment values as strings only, and hydra would read a bare 2 as an int
            [f"+ray_kwargs.ray_init.runtime_env.env_vars.OMP_NUM_THREADS='{cfg.torch_threads}'"]
            if cfg.torch_threads
            else []
        ),
        *(
            [f"+ray_kwargs.ray_init.runtime_env.env_vars.OMP_WAIT_POLICY={cfg.omp_wait_policy.upper()}"]
            if cfg.omp_wait_policy
            else []
        ),
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        # Dataloader worker processes only add start-up time and a noisy kill at shutdown on a small CPU box.
        "data.dataloader_num_workers=0",
        *(separate_pool_overrides(cfg.sampler_ranks) if cfg.sampler_ranks else []),
    ]


def separate_pool_overrides(sampler_ranks: int) -> list[str]:
    """A rollout pool of its own (one node of ``sampler_ranks`` CPU ranks) and the weight sync across the pools."""
    return [
        "actor_rollout_ref.hybrid_engine=False",
        "actor_rollout_ref.rollout.nnodes=1",
        f"actor_rollout_ref.rollout.n_gpus_per_node={sampler_ranks}",
        "actor_rollout_ref.rollout.checkpoint_engine.backend=gloo",
    ]
