"""A scoring process (:mod:`.scoring_processes`): reads ``(score_fn, kwargs)`` from stdin, answers
``("ok", result)`` or ``("error", exception)`` on stdout, one sample at a time, until its parent closes stdin.

The protocol owns the original stdin and stdout; a score that reads input gets end-of-file, and what it prints goes
to stderr, so neither can corrupt an answer.
"""

from __future__ import annotations

import importlib
import os
import pickle

from verl_pipe.reward_manager.scoring_processes import read_message, write_message

# What each scoring process imports before its first sample.
PRELOAD = ("verl_pipe.reward_score",)


def _prefer_as_oom_victim() -> None:
    # The sandbox's runner does the same, but it is a script (it reads its argv on import), not a library.
    try:
        with open("/proc/self/oom_score_adj", "w") as handle:
            handle.write("1000")
    except OSError:
        pass


def _answer(score_fn, kwargs) -> bytes:
    try:
        reply = ("ok", score_fn(**kwargs))
    except BaseException as error:  # noqa: BLE001 - whatever the score raises is the sample's, not this process's
        reply = ("error", error)
    try:
        return pickle.dumps(reply)
    except Exception:  # noqa: BLE001 - an unpicklable result or exception still gets an answer
        return pickle.dumps(("error", RuntimeError(f"the score's {type(reply[1]).__name__} could not be pickled")))


def main() -> None:
    requests = os.fdopen(os.dup(0), "rb", buffering=0)
    answers = os.fdopen(os.dup(1), "wb", buffering=0)
    quiet = os.open(os.devnull, os.O_RDONLY)
    os.dup2(quiet, 0)  # the score's own reads of stdin end at once
    os.dup2(2, 1)  # and its prints go to stderr
    _prefer_as_oom_victim()
    for module in PRELOAD:
        importlib.import_module(module)
    while (request := read_message(requests)) is not None:
        score_fn, kwargs = pickle.loads(request)
        write_message(answers, _answer(score_fn, kwargs))


if __name__ == "__main__":
    main()
