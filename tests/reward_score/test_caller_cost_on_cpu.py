"""The scoring process does not pay for what a candidate returns or how slowly its neighbours are scored.

* A functional answer chooses the value the caller decodes and compares, outside every sandbox limit: a few
  bytes of program returning ``[[]] * 3_000_000`` once cost the caller ~400 MB and seconds of CPU (measured
  before the budget: 8.5 s, 397 MB). The caller now decodes a returned value only within a budget proportional
  to the expected value, in bytes and in JSON nodes, and the runner sends no more than that.
* A reply that arrived before its deadline is read even when the reading thread gets to it late (a neighbour
  sample in the same process held the CPU): it used to be declared a timeout unread.
"""

from __future__ import annotations

import json
import time
import tracemalloc

import pytest

from verl_pipe.reward_score import compute_score
from verl_pipe.reward_score import grading
from verl_pipe.reward_score.grading import ResultBudget, return_value_matches
from verl_pipe.reward_score.sandbox import DeadlineExceeded, SandboxSession
from verl_pipe.reward_score.sandbox.session import parse_test_reply
from verl_pipe.reward_score.suites import TestCase as Case  # (not a pytest class)

TRUTH = json.dumps([{"input": "3", "output": "[1, 2, 3]", "testtype": "functional"}])
EXTRA = {"func_name": "f"}


def fenced(body: str) -> str:
    return f"```python\ndef f(n):\n    return {body}\n```"


def caller_cost(body: str) -> tuple[dict, float, float]:
    """(result, CPU seconds, peak MB allocated) of scoring in this process."""
    tracemalloc.start()
    try:
        started = time.process_time()
        result = compute_score("livecodebench", fenced(body), TRUTH, EXTRA)
        return result, time.process_time() - started, tracemalloc.get_traced_memory()[1] / 1e6
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("body", ["[[]] * 3_000_000", "[0] * 4_000_000", "'x' * 10_000_000", "[[[[]]]] * 500_000"])
def test_a_huge_return_value_costs_the_caller_almost_nothing(body):
    result, cpu_s, peak_mb = caller_cost(body)
    assert result["outcome"] == "wrong_answer", result
    assert peak_mb < 16 and cpu_s < 0.5, (cpu_s, peak_mb)


def test_negative_control_without_the_budget_the_caller_pays(monkeypatch):
    """The same payload decoded without a budget (the runner then sends up to its 16 MiB result cap)."""
    _, _, bounded_mb = caller_cost("[[]] * 3_000_000")
    monkeypatch.setattr(grading, "result_budget", lambda test: ResultBudget(max_bytes=1 << 30, max_nodes=1 << 40))
    result, _, unbounded_mb = caller_cost("[[]] * 3_000_000")
    assert result["outcome"] == "wrong_answer"
    assert unbounded_mb > 100 and unbounded_mb > 20 * bounded_mb, (bounded_mb, unbounded_mb)


def test_right_answers_of_every_shape_fit_their_budget():
    """The budget admits whatever can be equal: the runner's encoding (tuples and dicts wrapped) of the expected
    value, in every shape a functional test returns."""
    values = [0, -7, 2.5, "text", [1, 2, 3], [[1, 2], [3]], {"a": [1, {"b": 2}]}, [[]] * 50, ["x" * 300] * 3, []]
    for value in values:
        test = Case(expected=value)
        encoded = json.dumps(_runner_encoding(value))
        assert return_value_matches(encoded, test), value
    # a return value that is the expected one plus a little more is still compared (and is not equal)
    assert not return_value_matches(json.dumps([1, 2, 3, 4]), Case(expected=[1, 2, 3]))


def _runner_encoding(value):
    """What runner.encode_value sends for plain JSON-like values (dicts wrapped as pairs)."""
    if isinstance(value, list):
        return [_runner_encoding(item) for item in value]
    if isinstance(value, dict):
        return {"__dict__": [[key, _runner_encoding(item)] for key, item in value.items()]}
    return value


def test_over_budget_values_are_refused_before_decoding():
    budget = grading.result_budget(Case(expected=[1, 2, 3]))
    assert budget.max_bytes == grading.RESULT_BUDGET_MIN_BYTES and budget.max_nodes == grading.RESULT_BUDGET_MIN_NODES
    too_many_nodes = "[" + ",".join(["0"] * budget.max_nodes) + "]"  # under the byte budget, over the node budget
    assert len(too_many_nodes) <= budget.max_bytes
    assert not return_value_matches(too_many_nodes, Case(expected=[1, 2, 3]))
    big = Case(expected=list(range(10_000)))  # a big expected value gets a proportionally big budget
    assert return_value_matches(json.dumps(list(range(10_000))), big)


def test_a_reply_already_in_the_pipe_is_read_after_the_deadline():
    with SandboxSession() as box:
        assert box.load("print(int(input()) * 2)", mode="stdin") is None
        box._send({"op": "test", "stdin": "21\n", "args_json": "", "timeout": 5.0, "output_cap": 0, "result_cap": 0,
                   "test_code": "", "entry_point": "", "prompt_code": ""})  # fmt: skip
        time.sleep(1.0)  # the reply arrives while this thread is busy elsewhere
        reply = box._receive(time.monotonic() - 1.0)  # the thread gets to it after the deadline
        assert parse_test_reply(reply).stdout.strip() == "42"
    with SandboxSession() as box:  # and nothing arrived: the deadline holds
        assert box.load("import time\ntime.sleep(30)", mode="stdin") is None
        box._send({"op": "test", "stdin": "", "args_json": "", "timeout": 20.0, "output_cap": 0, "result_cap": 0,
                   "test_code": "", "entry_point": "", "prompt_code": ""})  # fmt: skip
        with pytest.raises(DeadlineExceeded):
            box._receive(time.monotonic() + 0.5)
