"""``in_flight_pipeline``'s parts, each against verl's real classes: the admission rule that bounds the lag, the
deadline-ordered replay buffer verl builds from its custom-sampler slot, the client that keeps each token's
version, the sync that aborts nothing, the token-lag metrics and the start-up checks."""

from __future__ import annotations

import asyncio
import os
from types import SimpleNamespace

import pytest

import verl  # noqa: F401 - registers the modes
from verl_pipe.trainers.config import PipelineConfig, PipelineConfigError
from verl_pipe.trainers.ray_trainer_in_flight import InFlightPipelineTrainer, admissible_prompts
from verl_pipe.trainers.sampler_slot import IN_FLIGHT_BUFFER_NAME, IN_FLIGHT_BUFFER_PATH
from verl_pipe.trainers.token_lag import SampleVersions, sample_versions, token_lag_metrics

MODE = "in_flight_pipeline"
LAYOUT = [
    f"trainer.v1.trainer_mode={MODE}",
    "actor_rollout_ref.hybrid_engine=False",
    "actor_rollout_ref.rollout.nnodes=1",
    "actor_rollout_ref.rollout.n_gpus_per_node=1",
    "actor_rollout_ref.rollout.checkpoint_engine.backend=gloo",
    "actor_rollout_ref.rollout.name=hf",
    "data.train_batch_size=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "trainer.device=cpu",
]


def _compose(overrides):
    import verl.trainer.main_ppo as main_ppo
    from hydra import compose, initialize_config_dir

    config_dir = os.path.join(os.path.dirname(main_ppo.__file__), "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


# --- the admission rule ----------------------------------------------------------------------------------------


def _admit(synced, next_step, untrained, lag, batch=4, free=100, left=100, waiting_room=None):
    return admissible_prompts(batch, synced, lag, next_step, untrained, free, left, waiting_room)


def test_lag_zero_admits_one_batch_per_sync_and_nothing_ahead_of_it():
    """Guards: a lag-0 run starting prompts before the sync that must generate them (off-policy data)."""
    assert _admit(synced=0, next_step=1, untrained=0, lag=0) == 4  # step 1's batch, on v0
    assert _admit(synced=0, next_step=1, untrained=4, lag=0) == 0  # and no more
    assert _admit(synced=0, next_step=2, untrained=0, lag=0) == 0  # step 1 took its batch; v1 is not synced yet
    assert _admit(synced=1, next_step=2, untrained=0, lag=0) == 4  # after the sync: step 2's batch


def test_lag_one_runs_a_batch_ahead_and_the_slots_and_run_length_bound_it():
    assert _admit(synced=0, next_step=1, untrained=0, lag=1) == 8  # steps 1 and 2 may train what v0 starts
    assert _admit(synced=0, next_step=2, untrained=3, lag=1) == 1  # step 2's room is all that is left for v0
    assert _admit(synced=1, next_step=2, untrained=3, lag=1) == 5
    assert _admit(synced=1, next_step=2, untrained=3, lag=1, free=2) == 2  # only free slots
    assert _admit(synced=1, next_step=2, untrained=3, lag=1, left=1) == 1  # the run's last prompt
    assert _admit(synced=0, next_step=3, untrained=0, lag=1) == 0  # never negative


def test_a_cap_on_the_untrained_groups_admits_only_its_room():
    """max_untrained_prompts: the feeder admits what the cap leaves, never more than the bound would, never below 0."""
    assert _admit(synced=0, next_step=1, untrained=0, lag=2) == 12  # uncapped: three batches under a bound of 2
    assert _admit(synced=0, next_step=1, untrained=0, lag=2, waiting_room=5) == 5
    assert _admit(synced=1, next_step=2, untrained=3, lag=2, waiting_room=2) == 2
    assert _admit(synced=0, next_step=2, untrained=3, lag=1, waiting_room=9) == 1  # the bound still binds first
    assert _admit(synced=1, next_step=2, untrained=3, lag=2, waiting_room=-1) == 0  # over the cap: nothing


def test_a_steps_untrained_peak_counts_the_groups_carried_into_it():
    """Guards: the step after one that left the cap full reading one short when the feeder submitted nothing in
    its window (it took its groups before the feeder's next poll; seen in CI as 'peak 4, not 5')."""
    import threading

    trainer = InFlightPipelineTrainer.__new__(InFlightPipelineTrainer)
    trainer._lock, trainer.slots = threading.Lock(), 8
    trainer.pipeline_cfg = PipelineConfig.from_section(MODE, {"max_untrained_prompts": 5})
    trainer._submitted, trainer._taken, trainer._dropped = 9, 4, 0  # step 1 took 4 of 9: 5 untrained, the cap
    trainer._generating_peak, trainer._untrained_peak = 5, 5
    first = trainer._take_peaks()
    assert first["in_flight/untrained_max"] == 5 and first["in_flight/max_untrained_prompts"] == 5
    trainer._taken = 8  # step 2 takes its 4 with no top-up in between
    assert trainer._take_peaks()["in_flight/untrained_max"] == 5  # the 5 it started with
    assert trainer._take_peaks()["in_flight/untrained_max"] == 1  # step 3 starts from the 1 left


def test_admitted_prompts_always_fit_before_their_deadlines():
    """Earliest-deadline-first with ``batch`` groups a step: however groups finish, none is trained late. The check
    fails when the rule admits one more prompt than it allows (the negative control)."""
    import random

    def simulate(extra: int, lag: int, steps: int = 12, batch: int = 4, seed: int = 0) -> int:
        rng = random.Random(seed)
        deadlines: list[int] = []  # untrained groups
        synced, late = 0, 0
        for step in range(1, steps + 1):
            for _ in range(rng.randint(1, 3)):  # the feeder tops up a few times while the step waits
                count = _admit(synced, step, len(deadlines), lag, batch=batch) + extra
                deadlines += [synced + 1 + lag] * count
            deadlines.sort()
            taken, deadlines = deadlines[:batch], deadlines[batch:]  # due first (the buffer's order)
            late += sum(d < step for d in taken) + sum(d <= step for d in deadlines)
            synced = step
        return late

    for lag in (0, 1, 2):
        assert simulate(extra=0, lag=lag) == 0
    assert simulate(extra=1, lag=1) > 0


# --- the replay buffer -------------------------------------------------------------------------------------------


@pytest.fixture
def buffer():
    from verl_pipe.trainers.in_flight_buffer import InFlightReplayBuffer

    config = _compose(LAYOUT)
    trainer = InFlightPipelineTrainer.__new__(InFlightPipelineTrainer)
    trainer.pipeline_cfg = PipelineConfig.from_section(MODE, {})
    from verl_pipe.trainers.sampler_slot import select_pipeline_replay_buffer

    select_pipeline_replay_buffer(config, *InFlightPipelineTrainer.REPLAY_BUFFER)
    slot = {"path": IN_FLIGHT_BUFFER_PATH, "name": IN_FLIGHT_BUFFER_NAME}
    assert dict(config.trainer.v1.sampler.custom_sampler) == slot
    trainer.config, trainer.trainer_mode = config, MODE
    built = trainer._build_replay_buffer()  # verl's own method, from the slot
    assert type(built) is InFlightReplayBuffer
    return built


def _state(buffer, deadlines: dict[str, int], generating=(), tokens=None, versions=None):
    """What TransferQueue holds: each group's deadline, the ones still generating, and of each finished group one
    sample with its response tokens and the version of its freshest token (``versions``; default 1)."""
    buffer.prompt_global_steps["train"] = dict(deadlines)
    buffer.running_keys["train"] = set(generating)
    buffer.finished_keys["train"] = set(deadlines) - set(generating)
    buffer.partitions["train"] = {
        f"{uid}_0_0": {"response_len": (tokens or {}).get(uid, 1), "max_global_steps": (versions or {}).get(uid, 1.0)}
        for uid in deadlines
        if uid not in generating
    }


def test_a_step_waits_for_its_due_groups_and_counts_them_held_back(buffer):
    """Guards: a long response due now being skipped for shorter ones (it would lag past the bound, or starve)."""
    _state(buffer, {"a": 2, "b": 3, "c": 3, "d": 3, "e": 3, "long": 2}, generating=["long"])
    ready = buffer.finished_keys["train"]
    assert not buffer._has_enough_samples(2, "train", 4, ready)  # 5 ready, but "long" is due at step 2
    assert buffer.take_counts() == {"held_back_groups": 1, "dropped_groups": 0}
    _state(buffer, {"a": 2, "b": 3, "c": 3, "d": 3, "e": 3, "long": 2}, tokens={"b": 50, "c": 40, "long": 9})
    assert buffer._has_enough_samples(2, "train", 4, buffer.finished_keys["train"])
    chosen, _, _ = buffer._select_prompt_uids("train", buffer.finished_keys["train"], 4)
    assert chosen[:2] == ["long", "a"] and chosen[2:] == ["b", "c"]  # due first; then the longest


def test_an_earlier_minibatch_takes_what_is_ready_if_the_due_groups_it_leaves_fit_later(buffer):
    """Minibatches: the first trains on ready groups while a due one still generates, as long as the step's later
    minibatches can still take every due group; otherwise it waits too."""
    deadlines = {"a": 2, "b": 3, "c": 3, "late1": 2, "late2": 2, "late3": 2}
    _state(buffer, deadlines, generating=["late1", "late2", "late3"])
    buffer.later_capacity = 2  # one more minibatch of 2 after this one
    assert not buffer._has_enough_samples(2, "train", 2, buffer.finished_keys["train"])  # 3 due left > 2
    _state(buffer, deadlines, generating=["late1", "late2"])
    assert buffer._has_enough_samples(2, "train", 2, buffer.finished_keys["train"])  # "a", "late3" now; 2 left fit
    buffer.later_capacity = 0
    assert not buffer._has_enough_samples(2, "train", 2, buffer.finished_keys["train"])  # the last minibatch waits


def test_a_finished_group_past_its_deadline_is_dropped_and_counted(buffer):
    _state(buffer, {"old": 1, "ok": 2})
    assert buffer._stale_terminal_keys(2, "train") == {"old"}
    assert buffer.take_counts() == {"held_back_groups": 0, "dropped_groups": 1}
    assert buffer._stale_terminal_keys(2, "val") == set()


class _Loads:
    """The trainer's weight sync, recorded (the version each load would carry)."""

    def __init__(self):
        self.versions = []

    def __call__(self, version, inside_gen_timer=False):
        self.versions.append(version)


def _trainer_after_update(buffer, update: int, updates: int = 2, step: int = 2, minibatch: int = 2):
    trainer = InFlightPipelineTrainer.__new__(InFlightPipelineTrainer)
    buffer._sync_metadata_from_transfer_queue = lambda: None  # the state _state() set is what TransferQueue holds
    buffer.trainer_version = step - 1  # on_sample_begin sets it: the step's pi_old
    trainer.config = SimpleNamespace(data=SimpleNamespace(train_batch_size=minibatch * updates))
    trainer.replay_buffer, trainer.global_steps = buffer, step
    trainer.local_trigger_step, trainer.parameter_sync_step = update, updates
    trainer._update_loads = {"sent": 0, "skipped": 0}
    trainer._unsent_update = trainer._version_after_update()  # what _step_once sets after the update
    trainer._sync_weights = _Loads()
    return trainer


def test_a_minibatch_updates_weights_load_once_the_steps_own_groups_have_generated(buffer):
    """Guards: a load after a step's first update reaching a group that step still trains (its tokens would come
    from weights newer than the pi_old they train against), and loads sent to a sampler with nothing to run."""
    # the step's own group "due" still generates: the load waits (it would sample from v1.5 and train against v1)
    _state(buffer, {"a": 2, "due": 2, "next": 3}, generating=["due", "next"])
    trainer = _trainer_after_update(buffer, update=0)
    trainer._load_update()
    assert trainer._sync_weights.versions == [] and trainer._unsent_update == 1.5
    # the next minibatch has taken "due": only the next step's groups generate, and go on under v1 + 1/2
    _state(buffer, {"a": 2, "due": 2, "next": 3}, generating=["next"])
    trainer.local_trigger_step = 1  # its on_sample_end
    trainer._load_update(inside_gen_timer=True)
    assert trainer._sync_weights.versions == [1.5] and trainer._update_loads == {"sent": 1, "skipped": 0}
    trainer._load_update()  # sent once
    assert trainer._sync_weights.versions == [1.5]
    # nothing generates: nothing to load into
    _state(buffer, {"a": 2, "due": 2, "next": 3})
    trainer = _trainer_after_update(buffer, update=0)
    trainer._load_update()
    assert trainer._sync_weights.versions == [] and trainer._update_loads == {"sent": 0, "skipped": 1}
    # a step of 4 updates: after its third, v1 + 3/4 (the last minibatch's 2 groups have finished already)
    _state(buffer, {"r1": 3, "r2": 3, "next": 3}, generating=["next"])
    trainer = _trainer_after_update(buffer, update=2, updates=4)
    trainer._load_update()
    assert trainer._sync_weights.versions == [1.75]


def test_a_minibatch_load_waits_until_the_finished_groups_can_fill_the_rest_of_the_step(buffer):
    """Guards: a load between a step's updates reaching groups that the same step then trains: their tokens come
    from weights newer than the step's pi_old, a lag below zero (measured 2026-12-06 on the math benchmark's
    in_flight_pipeline: a step in nine had a token lag min of -0.5). No group due now generates here, which was
    the whole rule before; the control is the same state with enough groups finished."""
    # after the first of 2 updates: the last minibatch takes 2 groups, only "r1" has finished; "n1", "n2" generate
    _state(buffer, {"r1": 3, "n1": 3, "n2": 3}, generating=["n1", "n2"])
    trainer = _trainer_after_update(buffer, update=0)
    trainer._load_update()
    assert trainer._sync_weights.versions == [] and trainer._unsent_update == 1.5  # held
    # the control: "r2" has finished too, so the last minibatch can be filled from groups of v1 only
    _state(buffer, {"r1": 3, "r2": 3, "n1": 3}, generating=["n1"])
    trainer._load_update()
    assert trainer._sync_weights.versions == [1.5]
    # a group that finished after the load (its last tokens from v1.5) is not what the step counts as ready
    _state(buffer, {"r1": 3, "late": 3, "n1": 3}, generating=["n1"], versions={"late": 1.5})
    assert buffer.ready_for_this_step() == 1
    trainer = _trainer_after_update(buffer, update=0)
    trainer._load_update()
    assert trainer._sync_weights.versions == []


def test_a_group_newer_than_the_steps_pi_old_is_taken_last(buffer):
    """Guards: the step's minibatch taking a long group a load reached while it generated (tokens of v1.5 trained
    against pi_old v1) before groups of v1 that fill it as well. Only when nothing else can fill the minibatch is
    the newer group taken. The control: with the trainer at v2 (the next step) it is an ordinary group again."""
    deadlines = {"short1": 3, "short2": 3, "newer": 3}
    _state(buffer, deadlines, tokens={"newer": 90, "short1": 5, "short2": 4}, versions={"newer": 1.5})
    buffer.trainer_version = 1
    chosen, _, _ = buffer._select_prompt_uids("train", buffer.finished_keys["train"], 2)
    assert chosen == ["short1", "short2"]  # not the longest first, as it would be otherwise
    chosen, _, _ = buffer._select_prompt_uids("train", buffer.finished_keys["train"], 3)
    assert chosen[-1] == "newer"  # the minibatch needs it
    buffer.trainer_version = 2
    chosen, _, _ = buffer._select_prompt_uids("train", buffer.finished_keys["train"], 2)
    assert chosen == ["newer", "short1"]


def test_update_loads_are_on_where_the_server_stages_them():
    def loads(rollout, configured=None):
        config = _compose(LAYOUT + [f"actor_rollout_ref.rollout.name={rollout}"])
        trainer = InFlightPipelineTrainer.__new__(InFlightPipelineTrainer)
        section = {} if configured is None else {"load_every_update": configured}
        trainer.pipeline_cfg = PipelineConfig.from_section(MODE, section)
        return trainer._loads_every_update(config)

    assert loads("hf") and not loads("vllm")  # vLLM's weight RPC would stall the sampler at every load
    assert not loads("hf", False) and loads("vllm", True)
    with pytest.raises(PipelineConfigError, match=f"trainer.v1.{MODE}.load_every_update"):
        PipelineConfig.from_section(MODE, {"load_every_update": "yes"})


# --- token versions: the client, and the lag metrics -------------------------------------------------------------


def test_the_client_keeps_every_tokens_version_across_a_resumed_request(monkeypatch):
    """Guards: verl's partial-rollout client keeping only the last piece's version (a sample cut under v3 and
    finished under v4 would then train as if all v4)."""
    from verl.workers.rollout.llm_server import LLMServerClient
    from verl.workers.rollout.replica import TokenOutput
    from verl_pipe.trainers.in_flight_sync import VersionKeepingClient

    pieces = [
        TokenOutput(token_ids=[1, 2], log_probs=[-1.0, -1.0], stop_reason="aborted", extra_fields={"global_steps": 3}),
        TokenOutput(token_ids=[3, 4, 5], log_probs=[-1.0] * 3, stop_reason="completed",
                    extra_fields={"global_steps": 5, "min_global_steps": 4, "token_versions": [4, 5, 5]}),
    ]  # fmt: skip

    async def scripted(self, request_id, **kwargs):
        return pieces.pop(0)

    async def no_pause(_seconds):
        return None

    monkeypatch.setattr(LLMServerClient, "generate", scripted)
    monkeypatch.setattr("verl.workers.rollout.llm_server.asyncio.sleep", no_pause)
    client = VersionKeepingClient.__new__(VersionKeepingClient)
    client.config = None
    out = asyncio.run(client.generate("r1", prompt_ids=[7], sampling_params={"max_tokens": 5}))
    assert out.token_ids == [1, 2, 3, 4, 5]
    assert out.extra_fields["token_versions"] == [3, 3, 4, 5, 5]
    assert (out.extra_fields["min_global_steps"], out.extra_fields["max_global_steps"]) == (3, 5)


def test_token_lag_weighs_tokens_not_samples():
    samples = [
        SampleVersions(response_len=4, version=5, token_versions=[4, 4, 5, 5]),  # spans two versions
        SampleVersions(response_len=2, version=5),
    ]
    lag = token_lag_metrics(samples, trainer_version=5, prefix="x")
    assert lag["x/token_lag/mean"] == pytest.approx(2 / 6)
    assert lag["x/token_lag/max"] == 1 and lag["x/token_lag/min"] == 0
    assert lag["x/spanning_samples_share"] == 0.5
    # a benchmark's real tokens stand for modelled ones: a long modelled answer weighs more
    heavy = sample_versions({"response_len": 2, "max_global_steps": 3}, {"modelled_response_tokens": 200}, True)
    light = sample_versions({"response_len": 2, "max_global_steps": 5}, {"modelled_response_tokens": 2}, True)
    assert token_lag_metrics([heavy, light], 5, "x")["x/token_lag/mean"] == pytest.approx(2 * 100 / 101)


def test_a_version_a_fraction_of_a_step_lags_by_that_fraction():
    """Tokens sampled by the weights of a step's first of two updates (v1.5), trained at step 3 (pi_old v2)."""
    from verl_pipe.trainers.token_lag import version_number

    sample = sample_versions({"response_len": 4, "max_global_steps": 1.5}, {"token_versions": [1, 1, 1.5, 1.5]})
    lag = token_lag_metrics([sample], trainer_version=2, prefix="x")
    assert lag["x/token_lag/mean"] == pytest.approx(0.75)  # half a version old and half one version old
    assert lag["x/token_lag/max"] == 1 and lag["x/token_lag/min"] == 0.5
    assert (version_number(1.5), version_number(2.0), type(version_number(2.0))) == (1.5, 2, int)


def test_the_benchmarks_token_lag_weighs_the_modelled_tokens_of_each_version():
    """A sync cut this sample after 600 of its 1000 modelled tokens, and verl resumed it with a fresh real generation
    of 3 tokens after 1 kept: by its real tokens only a quarter is a version old, by its modelled ones 60%."""
    tag = {"response_len": 4, "max_global_steps": 4}
    extra = {"modelled_response_tokens": 1000, "token_versions": [3, 4, 4, 4],
             "modelled_token_versions": [[600.0, 3], [400.0, 4]]}  # fmt: skip
    modelled = token_lag_metrics([sample_versions(tag, extra, modelled=True)], trainer_version=4, prefix="x")
    assert modelled["x/token_lag/mean"] == pytest.approx(0.6)
    assert modelled["x/token_lag/max"] == 1 and modelled["x/spanning_samples_share"] == 1.0
    # the control: the real tokens' account, which the trainer's own in_flight/ metric keeps (modelled=False)
    real = token_lag_metrics([sample_versions(tag, extra)], trainer_version=4, prefix="x")
    assert real["x/token_lag/mean"] == pytest.approx(0.25)


# --- the sync that aborts nothing ----------------------------------------------------------------------------------


def test_the_in_flight_sync_never_aborts_or_frees_the_kv_cache():
    from verl_pipe.trainers.in_flight_sync import InFlightCheckpointManager

    class Replica:
        def __getattr__(self, name):
            raise AssertionError(f"the in-flight sync called replica.{name}")

    manager = InFlightCheckpointManager.__new__(InFlightCheckpointManager)
    manager.replicas = [Replica()]
    steps = ("abort_replicas", "release_kv_cache_replicas", "resume_kv_cache_replicas", "resume_generation_replicas")
    for step in steps:
        asyncio.run(getattr(manager, step)())
    # the control: verl's own manager does reach the replicas there
    from verl.checkpoint_engine import CheckpointEngineManager

    verl_manager = CheckpointEngineManager.__new__(CheckpointEngineManager)
    verl_manager.replicas = [Replica()]
    with pytest.raises(AssertionError, match="abort_all_requests"):
        asyncio.run(verl_manager.abort_replicas())


# --- start-up checks ----------------------------------------------------------------------------------------------


def _check(overrides):
    config = _compose(LAYOUT + overrides)
    trainer = InFlightPipelineTrainer.__new__(InFlightPipelineTrainer)
    trainer.pipeline_cfg = PipelineConfig.from_section(MODE, config.trainer.v1.get(MODE, {}))
    trainer._check_layout(config)


def test_start_up_checks_name_the_key():
    _check([])
    _check(["actor_rollout_ref.rollout.name=vllm"])  # vLLM's engine loads between steps; its server tags tokens
    with pytest.raises(PipelineConfigError, match="rollout cannot do yet: set actor_rollout_ref.rollout.name=vllm"):
        _check(["actor_rollout_ref.rollout.name=sglang"])
    with pytest.raises(PipelineConfigError, match=f"trainer.v1.{MODE}.max_staleness"):
        _check([f"+trainer.v1.{MODE}.max_staleness=0"])
    for bad in ("-1", "1.5", "true"):
        with pytest.raises(PipelineConfigError, match=f"trainer.v1.{MODE}.max_lag"):
            _check([f"+trainer.v1.{MODE}.max_lag={bad}"])
    with pytest.raises(PipelineConfigError, match=f"trainer.v1.{MODE}.max_in_flight_prompts"):
        _check([f"+trainer.v1.{MODE}.max_in_flight_prompts=0"])
    with pytest.raises(PipelineConfigError, match=f"trainer.v1.{MODE}.max_untrained_prompts"):
        _check([f"+trainer.v1.{MODE}.max_untrained_prompts=0"])
    _check([f"+trainer.v1.{MODE}.max_untrained_prompts=4"])  # a minibatch (ppo_mini_batch_size=4) is enough
    with pytest.raises(PipelineConfigError, match=r"max_untrained_prompts=3 is below a minibatch.*at least 4"):
        _check([f"+trainer.v1.{MODE}.max_untrained_prompts=3"])
