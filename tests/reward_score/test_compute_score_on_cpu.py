"""End-to-end checks of verl_pipe.reward_score: real candidate programs run in real sandboxed subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from verl_pipe.reward_score import KNOWN_DATA_SOURCES, RESULT_KEYS, compute_score, extract_last_python_block
from verl_pipe.reward_score import sandbox as sandbox_pkg
from verl_pipe.reward_score.grading import stdout_matches
from verl_pipe.reward_score.sandbox import SandboxConfig, SandboxSession, isolation

SOURCE = "verl_pipe/easy_code"

SUM_TESTS = json.dumps(
    [
        {"input": "2 3\n", "output": "5\n", "testtype": "stdin"},
        {"input": "-1 1\n", "output": "0\n", "testtype": "stdin"},
        {"input": "10 20\n", "output": "30\n", "testtype": "stdin"},
    ]
)
CONCAT_TESTS = json.dumps(
    [
        {"input": "[1, 2]\n3", "output": "[1, 2, 3]", "testtype": "functional"},
        {"input": "[]\n0", "output": "[0]", "testtype": "functional"},
        {"input": '["a"]\n"b"', "output": '["a", "b"]', "testtype": "functional"},
    ]
)


def fenced(code: str, tag: str = "python") -> str:
    return f"Here is my solution.\n```{tag}\n{code}\n```\n"


def child_pids() -> list[int]:
    """PIDs (zombies included) whose parent is this test process."""
    me, found = os.getpid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me:
            found.append(int(entry))
    return found


def is_dead(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_correct_stdin_solution_scores_one():
    """Guards against a grader that never awards reward (e.g. broken stdin plumbing): RL would see all zeros."""
    result = compute_score(SOURCE, fenced("a, b = map(int, input().split())\nprint(a + b)"), SUM_TESTS)
    assert result["score"] == 1.0 and result["passed"] and result["outcome"] == "pass"
    assert result["tests_run"] == result["tests_total"] == 3
    assert set(result) == set(RESULT_KEYS)
    assert all(isinstance(v, (bool, int, float, str)) for v in result.values())


def test_wrong_answer_scores_zero():
    """Guards against a grader that rewards any program that merely runs cleanly."""
    result = compute_score(SOURCE, fenced("a, b = map(int, input().split())\nprint(a * b)"), SUM_TESTS)
    assert result["score"] == 0.0 and not result["passed"]
    assert result["outcome"] == "wrong_answer" and result["format_ok"]
    # 2*3 != 5 already, so grading must stop after the first test.
    assert result["tests_run"] == 1


def test_missing_code_block_is_format_error_with_penalty():
    """Guards against prose (or a non-Python block) being executed or silently scored like a wrong answer."""
    for response in ("The answer is print(5).", fenced("echo 5", tag="bash")):
        result = compute_score(SOURCE, response, SUM_TESTS, format_penalty=-0.5)
        assert result["outcome"] == "format_error" and not result["format_ok"]
        assert result["score"] == -0.5 and result["tests_run"] == 0 and result["tests_total"] == 3


def test_last_python_block_is_the_one_graded():
    """Guards against grading an early draft instead of the model's final answer."""
    draft, final = "print(0)", "a, b = map(int, input().split())\nprint(a + b)"
    assert compute_score(SOURCE, fenced(draft) + fenced(final, tag="py"), SUM_TESTS)["score"] == 1.0
    assert compute_score(SOURCE, fenced(final) + fenced(draft, tag=""), SUM_TESTS)["score"] == 0.0
    assert extract_last_python_block(fenced(final) + fenced("ls", tag="bash")) == final + "\n"


def test_crash_after_correct_output_is_runtime_error():
    """Guards against trusting stdout alone: a program that prints the answer and then dies must fail."""
    code = "a, b = map(int, input().split())\nprint(a + b, flush=True)\nraise RuntimeError('boom')"
    result = compute_score(SOURCE, fenced(code), SUM_TESTS)
    assert result["score"] == 0.0 and result["outcome"] == "runtime_error"


def test_exit_builtin_available_despite_no_site():
    """Guards against `python -S` dropping exit()/quit(), which would fail correct programs that call them."""
    code = "a, b = map(int, input().split())\nprint(a + b)\nexit(0)"
    assert compute_score(SOURCE, fenced(code), SUM_TESTS)["outcome"] == "pass"


def test_infinite_loop_times_out_without_leftover_children():
    """Guards against a hung candidate stalling the trainer or leaking processes/zombies across steps."""
    before = set(child_pids())
    start = time.monotonic()
    result = compute_score(SOURCE, fenced("while True:\n    pass"), SUM_TESTS, timeout=1)
    elapsed = time.monotonic() - start
    assert result["outcome"] == "timeout" and result["score"] == 0.0 and result["tests_run"] == 1
    assert elapsed < 5, f"timeout not enforced promptly ({elapsed:.1f}s)"
    assert set(child_pids()) - before == set()


@pytest.mark.parametrize("isolated", [True, False], ids=["bwrap", "unisolated"])
def test_timeout_kills_the_whole_process_tree(monkeypatch, isolated):
    """Guards against grandchildren (subprocesses the candidate spawns) surviving the kill of the main process,
    with and without namespaces."""
    if not isolated:
        monkeypatch.setattr(isolation, "probe_bwrap", lambda: "bwrap disabled for this test")
    marker = f"{61 + os.getpid() % 1000}.{int(time.time() * 1000) % 1000}"  # a sleep argument nobody else uses
    code = (
        "import subprocess\n"
        f"child = subprocess.Popen(['/bin/sleep', '{marker}'])\n"
        "print('started', flush=True)\n"
        "while True:\n    pass\n"
    )
    with SandboxSession(SandboxConfig(allow_unisolated=True)) as box:
        assert box.isolated is isolated
        assert box.load(code, mode="stdin") is None
        run = box.run_test(timeout=1)
    assert run.timed_out and not run.completed
    assert run.stdout.strip() == "started"
    time.sleep(0.3)
    # Sandboxed PIDs live in their own namespace, so look for the grandchild by its command line on the host.
    survivors = subprocess.run(["pgrep", "-f", f"sleep {marker}"], capture_output=True, text=True).stdout.split()
    assert all(is_dead(int(pid)) for pid in survivors), survivors


def test_unisolated_mode_needs_explicit_consent(monkeypatch, caplog):
    """Guards against silently running model-written code without namespaces when bubblewrap breaks."""
    monkeypatch.setattr(isolation, "probe_bwrap", lambda: "bubblewrap (bwrap) is not installed")
    with pytest.raises(sandbox_pkg.SandboxUnavailable, match="apt-get install -y bubblewrap"):
        compute_score(SOURCE, fenced("print(5)"), SUM_TESTS)
    with caplog.at_level("WARNING"):
        result = compute_score(SOURCE, fenced("print(5)"), SUM_TESTS, allow_unisolated=True)
    assert result["outcome"] == "wrong_answer"
    assert "WITHOUT namespace isolation" in caplog.text


def test_functional_class_solution_and_top_level_function():
    """Guards against a harness that only knows one calling convention and fails the other style outright."""
    as_class = "class Solution:\n    def concat(self, xs: List[Any], x: Any) -> List[Any]:\n        return xs + [x]"
    as_function = "def concat(xs, x):\n    print('debug noise')\n    return xs + [x]"
    info = {"func_name": "concat"}
    for code in (as_class, as_function):
        result = compute_score("livecodebench", fenced(code), CONCAT_TESTS, info)
        assert result["outcome"] == "pass", code
        assert result["tests_run"] == 3


def test_functional_tuple_equals_list_and_wrong_value_fails():
    """Guards against rejecting tuples (JSON has no tuple) and against accepting any returned value."""
    info = {"func_name": "concat"}
    as_tuple = "def concat(xs, x):\n    return tuple(xs) + (x,)"
    assert compute_score(SOURCE, fenced(as_tuple), CONCAT_TESTS, info)["score"] == 1.0
    wrong = compute_score(SOURCE, fenced("def concat(xs, x):\n    return xs"), CONCAT_TESTS, info)
    assert wrong["outcome"] == "wrong_answer" and wrong["tests_run"] == 1


def test_functional_ignores_main_guard_and_reports_errors():
    """Guards against a candidate's `if __name__ == '__main__': input()` demo turning a right answer into a crash."""
    info = {"func_name": "concat"}
    code = "def concat(xs, x):\n    return xs + [x]\n\nif __name__ == '__main__':\n    print(concat(eval(input()), 1))"
    assert compute_score(SOURCE, fenced(code), CONCAT_TESTS, info)["outcome"] == "pass"
    raising = compute_score(SOURCE, fenced("def concat(xs, x):\n    raise ValueError"), CONCAT_TESTS, info)
    assert raising["outcome"] == "runtime_error"
    missing = compute_score(SOURCE, fenced("def other(xs, x):\n    return xs"), CONCAT_TESTS, info)
    assert missing["outcome"] == "runtime_error"


def test_functional_infinite_loop_times_out_per_test():
    """Guards against one hung functional test costing the whole batched budget (tests x timeout)."""
    start = time.monotonic()
    result = compute_score(
        SOURCE,
        fenced("def concat(xs, x):\n    while True:\n        pass"),
        CONCAT_TESTS,
        {"func_name": "concat"},
        timeout=1,
    )
    assert result["outcome"] == "timeout"
    assert time.monotonic() - start < 3.5


def test_functional_without_func_name_raises():
    """Guards against silently scoring every functional row 0 because the dataset forgot func_name."""
    with pytest.raises(ValueError, match="func_name"):
        compute_score(SOURCE, fenced("def concat(xs, x):\n    return xs"), CONCAT_TESTS, {})


def test_decimal_token_comparison():
    """Guards against failing numerically equal outputs ("1.0" vs "1.00") or passing different numbers."""
    assert stdout_matches("1.0\n", "1.00")
    assert stdout_matches("  2.50 3\n\n", "2.5 3.0\n")
    assert not stdout_matches("1", "2")
    assert not stdout_matches("1 2", "1 2 3")
    assert not stdout_matches("abc", "abd")
    assert not stdout_matches("1\n2", "1")
    tests = json.dumps([{"input": "", "output": "1.00\n", "testtype": "stdin"}])
    assert compute_score(SOURCE, fenced("print(1.0)"), tests)["score"] == 1.0
    assert compute_score(SOURCE, fenced("print(2)"), tests)["score"] == 0.0


def test_unknown_data_source_raises_naming_known_sources():
    """Guards against grading a foreign dataset's ground truth with the wrong rules and logging garbage reward."""
    with pytest.raises(ValueError) as info:
        compute_score("openai/gsm8k", fenced("print(1)"), SUM_TESTS)
    for name in KNOWN_DATA_SOURCES:
        assert name in str(info.value)


def test_ground_truth_may_be_a_list():
    """Guards against rows whose tests were already decoded (e.g. by a loader) failing to parse."""
    result = compute_score(SOURCE, fenced("print(sum(map(int, input().split())))"), json.loads(SUM_TESTS))
    assert result["score"] == 1.0


def test_prelude_imports_do_not_answer_for_the_candidate():
    """Guards against the harness calling a prelude import (math.gcd) when the candidate defined nothing."""
    tests = json.dumps(
        [
            {"input": f"{a}\n{b}", "output": str(g), "testtype": "functional"}
            for a, b, g in [(12, 18, 6), (7, 5, 1), (9, 9, 9)]
        ]
    )
    info = {"func_name": "gcd"}
    assert compute_score(SOURCE, fenced("print(0)"), tests, info)["outcome"] == "runtime_error"
    # Importing it explicitly is the candidate's own (legitimate) answer.
    assert compute_score(SOURCE, fenced("from math import gcd"), tests, info)["outcome"] == "pass"


def test_functional_large_correct_output_passes():
    """Guards against the 1 MiB output cap turning a correct but large return value into a runtime error."""
    big = json.dumps(list(range(200_000)))
    tests = json.dumps([{"input": "200000", "output": big, "testtype": "functional"}] * 5)
    info = {"func_name": "upto"}
    assert compute_score(SOURCE, fenced("def upto(n):\n    return list(range(n))"), tests, info)["outcome"] == "pass"
    off_by_one = compute_score(SOURCE, fenced("def upto(n):\n    return list(range(1, n + 1))"), tests, info)
    assert off_by_one["outcome"] == "wrong_answer"


def test_interpreter_prefix_under_tmp_is_bound_after_the_private_tmp(monkeypatch):
    """Guards: an interpreter installed under /tmp vanishing behind the sandbox's private /tmp, which turned
    every program, right or wrong, into a runtime error."""
    monkeypatch.setattr(isolation, "_interpreter_roots", lambda: ["/tmp/uv/python-3.11"])
    argv = isolation.bwrap_argv(SandboxConfig(), "bwrap")
    tmpfs, bind = argv.index("/tmp"), argv.index("/tmp/uv/python-3.11")
    assert argv[tmpfs - 1] == "--tmpfs" and argv[bind - 1] == "--ro-bind" and tmpfs < bind
