"""The vLLM server's prefill log (:mod:`verl_pipe.rollout.prefill_log`) on verl's own ``TokenOutput``: a
request aborted mid-answer and resubmitted the way verl's partial-rollout client does it (prompt plus the answer so
far) is counted as re-prefilling that answer; a request that merely starts like it is not."""

import json

import pytest

from verl.workers.rollout.replica import TokenOutput
from verl_pipe.rollout.prefill_log import PREFILL_LOG_ENV, PrefillLog, read_prefill_log

PROMPT = list(range(100, 120))  # 20 tokens


def _output(tokens: list[int], stop: str, cached=None) -> TokenOutput:
    return TokenOutput(token_ids=tokens, log_probs=None, stop_reason=stop, extra_fields={"num_cached_tokens": cached})


def test_a_resubmitted_answer_is_counted_as_prefilled_again(tmp_path):
    path = str(tmp_path / "prefill.jsonl")
    log = PrefillLog(path, replica=0)
    log.record(PROMPT, _output([1, 2, 3, 4, 5], "aborted", cached=0))  # the sync aborts it after 5 tokens
    log.record(PROMPT + [1, 2, 3, 4, 5], _output([6, 7], "aborted", cached=0))  # and the next one after 2 more
    log.record(PROMPT + [1, 2, 3, 4, 5, 6, 7], _output([8, 9, 10], "completed", cached=16))
    # another sample of the same prompt: its prefix is in the cache, and it resumes nothing
    log.record(PROMPT, _output([11, 12], "completed", cached=16))

    summary = read_prefill_log(path)
    assert (summary.requests, summary.aborted, summary.resubmitted) == (4, 2, 2)
    assert summary.prompt_tokens == 20 + 25 + 27 + 20
    assert summary.prefilled_tokens == 20 + 25 + (27 - 16) + (20 - 16)
    assert summary.resubmission_prefilled_tokens == 25 + (27 - 16)
    # the second resubmission's 7 answer tokens were computed again despite the 16 cached: 27 - 16 = 11 >= 7
    assert summary.reprefilled_answer_tokens == 5 + 7
    assert summary.output_tokens == 5 + 2 + 3 + 2
    assert summary.per(2)["reprefilled_answer_tokens"] == 6


def test_control_a_prompt_that_only_starts_like_an_aborted_answer_resumes_nothing(tmp_path):
    path = str(tmp_path / "prefill.jsonl")
    log = PrefillLog(path, replica=0)
    log.record(PROMPT, _output([1, 2, 3], "aborted", cached=0))
    log.record(PROMPT + [1, 2], _output([9], "completed", cached=0))  # not the aborted request's prompt + output
    log.record(PROMPT + [1, 2, 3, 4], _output([9], "completed", cached=0))
    summary = read_prefill_log(path)
    assert (summary.resubmitted, summary.resubmission_prefilled_tokens, summary.reprefilled_answer_tokens) == (0, 0, 0)


def test_the_log_is_off_unless_the_environment_names_a_file(tmp_path, monkeypatch):
    monkeypatch.delenv(PREFILL_LOG_ENV, raising=False)
    assert PrefillLog.from_env(replica=0) is None
    path = str(tmp_path / "prefill.jsonl")
    monkeypatch.setenv(PREFILL_LOG_ENV, path)
    log = PrefillLog.from_env(replica=3)
    log.record(PROMPT, _output([], "aborted"))  # vLLM aborted it before any token: no cache count to read
    (line,) = [json.loads(text) for text in open(path)]
    assert line["replica"] == 3 and line["cached_tokens"] is None
    assert read_prefill_log(path).prefilled_tokens == len(PROMPT)


@pytest.mark.parametrize("stop", ["aborted", "abort"])
def test_both_of_verls_abort_reasons_count(tmp_path, stop):
    path = str(tmp_path / "prefill.jsonl")
    log = PrefillLog(path, replica=0)
    log.record(PROMPT, _output([1], stop, cached=0))
    log.record(PROMPT + [1], _output([2], "completed", cached=0))
    assert read_prefill_log(path).resubmitted == 1
