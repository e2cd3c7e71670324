"""``make gpu-check``'s logic, without a GPU: its refusal on a machine without them (the command as typed), the run
it would start for each mode (composed and validated against verl's own config schema for a GPU cluster, as the
recipes' dry run does, and resolving verl-pipe's extended vLLM server for our modes), and its checks on a run's
records: each passes on a good run and fails when the property it guards breaks."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from verl_pipe.gpu_check import (
    LAG_MAX,
    PROMPTS,
    SPANNING,
    STALENESS,
    STEPS,
    GpuCheckError,
    RunRecords,
    check_run,
    format_table,
    preflight,
    run_overrides,
)
from verl_pipe.trainer_modes import TRAINER_MODES

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _nvidia_smi(*gpus: str, returncode: int = 0):
    lines = "".join(f"GPU {i}: {name} (UUID: GPU-{i})\n" for i, name in enumerate(gpus))
    return lambda argv, **kwargs: SimpleNamespace(returncode=returncode, stdout=lines, stderr="driver not loaded")


def test_it_refuses_a_machine_with_fewer_than_two_gpus_and_counts_them_otherwise():
    with pytest.raises(GpuCheckError, match=r"2 or more NVIDIA GPUs .* found 1 NVIDIA GPU\(s\): GPU 0: NVIDIA H100"):
        preflight(run=_nvidia_smi("NVIDIA H100"))
    with pytest.raises(GpuCheckError, match="found nvidia-smi failed: driver not loaded"):
        preflight(run=_nvidia_smi(returncode=9))
    assert preflight(run=_nvidia_smi(*["NVIDIA H100"] * 4)) == 4


def test_make_gpu_check_as_typed_refuses_this_gpu_less_machine_before_installing_anything():
    if os.path.exists("/usr/bin/nvidia-smi"):
        pytest.skip("this machine has an NVIDIA driver")
    done = subprocess.run(["make", "-s", "gpu-check"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "make gpu-check needs a machine with 2 or more NVIDIA GPUs" in done.stderr, done.stderr
    assert "nvidia-smi is not installed" in done.stderr
    assert not os.path.exists(os.path.join(REPO, ".venv-gpu")), "it installed before it checked"


@pytest.fixture(scope="module")
def validated(tmp_path_factory) -> dict:
    """Each mode's run on 4 GPUs, composed and validated as the recipes' dry run validates (platform cuda)."""
    from verl_pipe.recipe_check import RecipeContext, compose_config, validate

    saved = os.environ.pop("VERL_PLATFORM", None)
    try:
        out = {}
        for mode in TRAINER_MODES:
            run_dir = str(tmp_path_factory.mktemp(mode))
            overrides = run_overrides(mode, 4, "/models/smollm2", "/data/train.parquet", "/data/val.parquet", run_dir)
            out[mode] = validate(compose_config(overrides), RecipeContext(recipe=mode, check_paths=False,
                                                                          cluster_gpus=4))  # fmt: skip
        return out
    finally:
        if saved is not None:
            os.environ["VERL_PLATFORM"] = saved


def test_each_modes_run_composes_against_verls_schema_for_a_gpu_cluster(validated):
    for mode, summary in validated.items():
        layout, classes = summary.layout, summary.rollout_classes
        assert summary.trainer_mode == mode and classes["platform"] == "cuda" and summary.rollout_name == "vllm"
        assert layout["total_gpus"] == 4, layout
        if TRAINER_MODES[mode].separate_pools:
            assert (layout["trainer_gpus"], layout["sampler_gpus"], summary.weight_sync) == (1, 3, "nccl")
        else:
            assert layout["hybrid_engine"] and layout["trainer_gpus"] == 4
        ours = TRAINER_MODES[mode].from_plugin
        assert classes["replica"].startswith("verl_pipe.rollout.vllm_server:" if ours else "verl.workers."), classes
        assert classes["in_flight_loads"] == (mode == "in_flight_pipeline")
        assert summary.reward_path == "pkg://verl_pipe.gpu_check" and summary.n == 4


def _good(mode: str = "in_flight_pipeline") -> RunRecords:
    steps = [{"timing_s/step": 9.0 + i, STALENESS: 0 if i == 0 else 1, "training/rollout_probs_diff_mean": 0.002,
              "training/rollout_probs_diff_max": 0.01, "training/rollout_actor_probs_pearson_corr": 0.999,
              SPANNING: 0.25, LAG_MAX: 1.0, "response/aborted_ratio": 0.0} for i in range(STEPS)]  # fmt: skip
    ledger = [{"step": s + 1, "prompts_trained": list(range(s * PROMPTS, (s + 1) * PROMPTS))} for s in range(STEPS)]
    # two replicas, each loading the same weights at each sync (interleaved, as their engines append)
    probe = [{"replica": str(r), "checksum": 1.0 + i} for i in range(STEPS + 1) for r in (0, 1)]
    return RunRecords(mode, 0, steps, ledger, [{"aborted": False}] * 8, probe, 0)


@pytest.mark.parametrize(("name", "breaks", "says"), [
    ("engine agrees", lambda r: r.steps[0].update({"training/rollout_probs_diff_mean": 0.4}), "step 1: mean"),
    ("syncs reach engine", lambda r: r.probe.__setitem__(2, {"replica": "0", "checksum": 1.0}), "checksums"),
    ("load mid-answer", lambda r: [s.update({SPANNING: 0.0}) for s in r.steps], "0% of samples span"),
    ("load mid-answer", lambda r: r.prefill.append({"aborted": True}), "1 aborted"),
    ("lag bound", lambda r: r.steps[2].update({LAG_MAX: 2.0}), "max token lag 2"),
    ("prompts once", lambda r: r.ledger[1]["prompts_trained"].__setitem__(0, 0), "1 trained twice"),
    ("/dev/shm", lambda r: setattr(r, "shm_left_bytes", 400 << 20), "bytes left"),
])  # fmt: skip
def test_each_check_passes_on_a_good_run_and_fails_when_its_property_breaks(name, breaks, says):
    good = check_run(_good())
    assert good.passed and good.cells[name].startswith("ok"), good
    assert good.step_s == pytest.approx(10.5)  # the mean after the first step
    broken = _good()
    breaks(broken)
    result = check_run(broken)
    assert not result.passed and result.cells[name].startswith("FAIL") and says in result.cells[name], result.cells


def test_verls_modes_are_not_held_to_what_only_ours_promise_and_a_failed_run_fails():
    result = check_run(RunRecords("sync", 0, _good().steps, None, [], _good().probe, 0))
    assert result.cells["prompts once"].startswith("n/a") and result.cells["load mid-answer"] == "n/a"
    crashed = check_run(RunRecords("separate_async", 1, _good().steps[:1], None, [], [], 0))
    assert not crashed.passed and "exited 1 after 1 of 3 steps" in crashed.failures[0]
    table = format_table([check_run(_good()), crashed], gpus=4)
    assert "| `in_flight_pipeline` | 3/3 | 10.5 | ok" in table and "FAILED:" in table
