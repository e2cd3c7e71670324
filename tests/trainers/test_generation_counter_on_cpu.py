"""one_off_pipeline's "batch generated" signal: counts reported by agent-loop workers, asked by the trainer.

Runs against the shared Ray cluster in a subprocess (the test process itself never joins Ray). Checked:

* verl's per-session reward call (``AgentLoopWorker._compute_score``, the first thing V1's post-processing does
  after generation) is wrapped on import, and the wrap reports the session to the counter named in the config,
  then runs verl's method;
* the trainer's check is false while a prompt is pending or a running prompt has generated fewer than
  ``rollout.n`` sessions, true once all have, and turns itself off (falls back to terminal statuses) when a
  prompt reports more sessions than ``rollout.n``;
* counts of trained batches are forgotten, and a report that cannot reach its counter does not raise.

The end-to-end effect (the sync overlapping the batch's reward tail) is asserted by the pipeline benchmark's
test, where the modelled reward makes the tail long enough to see.
"""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = r"""
import asyncio, inspect, json, sys, time
import ray
from omegaconf import OmegaConf

ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
import verl.trainer.ppo.v1.agent_loop_tq as agent_loop_tq
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
from verl_pipe.patching import is_patched
from verl_pipe.trainers import patches
from verl_pipe.trainers.generation_counter import GenerationWatch

out = {"wrapped_on_import": is_patched(AgentLoopWorker._compute_score)}
# V1's post-processing asks for the reward first: the report comes after generation, before TransferQueue.
post = inspect.getsource(agent_loop_tq.AgentLoopWorkerTQ.__ray_actor_class__._agent_loop_postprocess)
out["score_first"] = post.index("self._compute_score(") < post.index("tq.async_kv_batch_put(")

watch = GenerationWatch(samples_per_prompt=2)
config = OmegaConf.create(
    {"trainer": {"v1": {"trainer_mode": "one_off_pipeline", "one_off_pipeline": {"generation_counter": watch.name}}}}
)
calls = []

async def verls_compute_score(self, outputs, kwargs):
    calls.append(kwargs["uid"])

# Wrap a recording function the way the patch wraps verl's, so verl's reward loop is not needed here.
original = AgentLoopWorker._compute_score
AgentLoopWorker._compute_score = verls_compute_score
try:
    patches._patch_report_generated_sessions()
    wrapped = AgentLoopWorker._compute_score
finally:
    AgentLoopWorker._compute_score = original

class Worker:  # stands in only for `self`: the wrap reads self.config and calls verl's method next
    config = config

def finish(uid, tag=3):
    asyncio.run(wrapped(Worker(), ["output"], {"uid": uid, "session_id": 0, "global_steps": tag}))

def settled(uids, expect):
    deadline = time.time() + 30
    while time.time() < deadline:
        counts = ray.get(watch.actor.sessions.remote(uids))
        if counts == expect:
            return counts
        time.sleep(0.05)
    return counts

finish("a")
out["calls"] = list(calls)
out["after_one_session"] = settled(["a", "b"], [1, 0])
out["one_of_two"] = watch.all_generated(pending=[], running=["a"])
out["pending_blocks"] = watch.all_generated(pending=["b"], running=[])
finish("a")
settled(["a"], [2])
out["two_of_two"] = watch.all_generated(pending=[], running=["a"])
out["nothing_running"] = watch.all_generated(pending=[], running=[])
watch.forget_before(4)
out["forgotten"] = settled(["a"], [0])
for _ in range(3):
    finish("c", tag=5)
settled(["c"], [3])
out["over_n"] = watch.all_generated(pending=[], running=["c"])
out["disabled"] = not watch.enabled
# A counter that cannot be reached costs the early sync, never the sample: the report must not raise.
from verl_pipe.trainers.generation_counter import report_generated
lost = OmegaConf.create({"trainer": {"v1": {"trainer_mode": "one_off_pipeline",
                                            "one_off_pipeline": {"generation_counter": "no_such_actor"}}}})
report_generated(lost, {"uid": "d", "global_steps": 1})
out["lost_report_survived"] = True
print("RESULT" + json.dumps(out))
"""


def test_sessions_are_counted_and_the_check_is_conservative(ray_cluster):
    proc = subprocess.run([sys.executable, "-c", SCRIPT, ray_cluster], capture_output=True, text=True, timeout=180)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT") :])
    assert out["wrapped_on_import"], "the plugin wraps verl's per-session reward call when verl imports it"
    assert out["score_first"], "verl's V1 post-processing no longer asks for the reward before storing samples"
    assert out["calls"] == ["a"], "verl's own method still runs"
    assert out["after_one_session"] == [1, 0]
    assert out["one_of_two"] is False, "one of rollout.n=2 sessions generated: the group is still in a server"
    assert out["pending_blocks"] is False, "a pending prompt has not even started"
    assert out["two_of_two"] is True
    assert out["nothing_running"] is True
    assert out["forgotten"] == [0], "counts of trained batches are dropped"
    assert out["over_n"] is False and out["disabled"] is True, "more sessions than rollout.n: counts not trusted"
    assert out.get("lost_report_survived"), "a report to a missing counter must not fail the session"
