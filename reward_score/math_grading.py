"""Rule-based math reward with DeepScaleR (rllm ``RewardMathFn``) semantics.

The answer is the last ``\\boxed{...}`` (or ``\\fbox{...}``) after the last ``</think>``; it is correct iff it
matches any acceptable ground truth under mathd-style string normalisation, or, failing that, under sympy
with the decisions of verl's ``prime_math.grade_answer`` (:mod:`.math_symbolic`, which parses only
expressions its gate proves inert, where verl's ``eval``-s whatever the answer says), run in a forked,
resource-limited and unprivileged child with a hard deadline.

Behaviour choices worth knowing:

* ``x=5`` vs ``5`` is **correct**: mathd normalisation drops a left-hand side of at most two characters
  (``x=``, ``k =``), as DeepScaleR does. Longer left-hand sides (``ab+c=5``) are kept.
* Plain numbers compare by value, so ``073`` vs ``73`` and ``5.0`` vs ``5`` are correct.
* A response that opens ``<think>`` but never closes it, or has no (or an empty) boxed answer, is a
  format error.
* A ground-truth *string* is read as a JSON list only when it decodes to a list of JSON strings
  (``'["1/2", "0.5"]'``); ``"[1, 2]"`` stays the closed interval it most likely is.
* A boxed answer longer than :data:`MAX_ANSWER_CHARS` (1000) characters is a wrong answer, decided without
  any normalisation; a response longer than :data:`MAX_RESPONSE_CHARS` (1 Mi characters) is a format error,
  decided without a scan.
* Numbers compare exactly: ``1e-8`` is not ``0`` and ``2.99999999`` is not ``2`` (verl's normalisation rounds
  anything within 1e-7 of an integer to it; :func:`.math_symbolic.rounded_to_an_integer` undoes that). A
  problem that accepts an approximation lists the acceptable answers.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import math
import numbers
import os
import re
import resource
import select
import signal
import threading
import time
from decimal import Decimal
from typing import Any

from verl.utils.reward_score.prime_math.math_normalize import normalize_answer

from .math_symbolic import MAX_ANSWER_CHARS, grade_answer, warm_up

__all__ = ["MATH_DATA_SOURCES", "MAX_ANSWER_CHARS", "SYMPY_TIMEOUT_S", "is_math_source", "score_math"]

logger = logging.getLogger(__name__)

# Data sources graded here (compared case-insensitively): rllm/DeepScaleR's names plus verl's MATH names.
# Any name starting with "aime" or "amc" (aime2024, aime25, amc23, ...) is math too. math_dapo is *not*
# listed: its prompts ask for "Answer: ..." rather than a boxed answer.
MATH_DATA_SOURCES: tuple[str, ...] = (
    "deepscaler",
    "math",
    "math500",
    "aime",
    "amc",
    "minerva",
    "olympiad_bench",
    "omni_math",
    "agentica-org/DeepScaleR-Preview-Dataset",
    "lighteval/MATH",
    "DigitalLearningGmbH/MATH-lighteval",
    "HuggingFaceH4/MATH-500",
)
_MATH_NAMES = frozenset(name.lower() for name in MATH_DATA_SOURCES)

# Hard bound on the sympy stage for one response (all ground truths together); a timeout counts as "not equal".
SYMPY_TIMEOUT_S = 3.0
ANSWER_CHARS = 200

# The sympy child: address space it may add to what it inherits, the user it drops to when started as root
# (nobody/nogroup), and its verdict bytes.
CHILD_MEMORY_HEADROOM_BYTES = 1 << 30
CHILD_UID = CHILD_GID = 65534
_EQUAL, _NOT_EQUAL, _SETUP_FAILED = b"1", b"0", b"S"
_warm_lock = threading.Lock()
_warmed_up = False
_setup_failure_reported = False

_BOX_CMD = re.compile(r"\\(boxed|fbox)(?![A-Za-z])(\s*)")
_BRACE = re.compile(r"[{}]")
# A plain number, with an optional exponent: compared exactly as decimals (1e-8 is not 0).
_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
# A response longer than this is a format error, not scanned: a real one is at most a few hundred thousand
# characters (64K tokens), and scanning costs time linear in the length (seconds at 8 MiB).
MAX_RESPONSE_CHARS = 1 << 20


def is_math_source(data_source: str) -> bool:
    """True for the names in :data:`MATH_DATA_SOURCES` and any name starting with ``aime`` or ``amc``."""
    if not isinstance(data_source, str):
        return False
    name = data_source.lower()
    return name in _MATH_NAMES or name.startswith(("aime", "amc"))


def _last_box_command(text: str) -> re.Match | None:
    """The last ``\\boxed``/``\\fbox`` command: one forward pass over the text (linear in its length, whatever it
    holds). The search from the end it replaces stepped back one rejected match at a time (``\\boxedx``) and
    looked for the other command over the whole prefix each time: quadratic, 9 s of the caller's CPU at 640 KB."""
    last = None
    for last in _BOX_CMD.finditer(text):
        pass
    return last


def _extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{}``/``\\fbox{}`` (nested braces kept), or None when there is none: verl's
    ``last_boxed_only_string`` rule on the last command, in one linear pass (verl's helper, handed the text from
    the last command on, would look again for the last ``\\boxed`` in it, a rejected ``\\boxedx`` included)."""
    last = _last_box_command(text)
    if last is None:
        return None
    cmd, space, start = last.group(1), last.group(2), last.end()
    if text.startswith("{", start):
        depth = 0
        for brace in _BRACE.finditer(text, start):
            depth += 1 if brace.group() == "{" else -1
            if depth == 0:
                return text[start + 1 : brace.start()].strip()
        return None  # unbalanced braces: the response was cut off inside the box
    if cmd == "boxed" and space:
        return text[start:].split("$", 1)[0].strip()  # Hendrycks' "\boxed 5$" form, as verl's helper reads it
    return None


def _ground_truths(ground_truth: Any) -> list[str]:
    """Acceptable answers as non-empty strings; raises ValueError for a missing or empty ground truth."""
    if hasattr(ground_truth, "tolist") and not isinstance(ground_truth, str):
        ground_truth = ground_truth.tolist()  # numpy arrays/scalars, as verl's parquet loading yields them
    if isinstance(ground_truth, str) and ground_truth.strip().startswith("["):
        with contextlib.suppress(ValueError):
            decoded = json.loads(ground_truth)
            if isinstance(decoded, list) and all(isinstance(item, str) for item in decoded):
                ground_truth = decoded
    items = list(ground_truth) if isinstance(ground_truth, (list, tuple)) else [ground_truth]
    if not items:
        raise ValueError("math ground truth is an empty list; expected at least one acceptable answer")
    answers = []
    for item in items:
        if item is None or isinstance(item, bool) or not isinstance(item, (str, numbers.Number)):
            raise ValueError(f"math ground truth must be a string, a number or a list of them, got {item!r}")
        text = str(item).strip()
        if "\\boxed" in text or "\\fbox" in text:  # reference solutions sometimes keep their box
            text = _extract_boxed(text) or text
        if not text:
            raise ValueError(f"math ground truth is empty: {ground_truth!r}")
        answers.append(text)
    return answers


def _cheap_equal(answer: str, truth: str) -> bool | None:
    """True/False when string normalisation settles it, None when sympy has to decide."""
    a, t = normalize_answer(answer), normalize_answer(truth)
    if a == t:
        return True
    if _PLAIN_NUMBER.fullmatch(a) and _PLAIN_NUMBER.fullmatch(t):
        return Decimal(a) == Decimal(t)  # exact, and spares a fork for the common integer answers
    return None


def _limit(which: int, value: int) -> None:
    """Lower both the soft and the hard limit to ``value`` (or to the hard limit already there, if lower)."""
    _soft, hard = resource.getrlimit(which)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(which, (value, value))


def _confine_child(keep_fd: int, cpu_seconds: int) -> None:
    """Shut the forked sympy child in before it looks at the answer; raises if any step fails.

    Simple calls in the freshly forked (single-threaded) child, in this order: no stdin and no inherited
    descriptors but ``keep_fd`` (the verdict pipe) and /dev/null on 0-2; at most
    ``CHILD_MEMORY_HEADROOM_BYTES`` more address space than it inherited, ``cpu_seconds`` of CPU, no core
    files and no file growth; as root, a switch to ``CHILD_UID``/``CHILD_GID`` with no supplementary
    groups (and a check that it cannot switch back); then no new processes or threads.
    """
    gc.freeze()  # objects inherited from the parent (open files among them) are never collected here
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    if devnull > 2:
        os.close(devnull)
    os.closerange(3, keep_fd)
    os.closerange(keep_fd + 1, max(os.sysconf("SC_OPEN_MAX"), keep_fd + 1))  # close_range(2) where it exists

    with open("/proc/self/statm", "rb") as statm:  # first field: address space in pages
        address_space = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    _limit(resource.RLIMIT_AS, address_space + CHILD_MEMORY_HEADROOM_BYTES)
    _limit(resource.RLIMIT_CPU, cpu_seconds)
    _limit(resource.RLIMIT_CORE, 0)
    _limit(resource.RLIMIT_FSIZE, 0)

    if os.getuid() == 0 or os.geteuid() == 0:
        os.setgroups([])
        os.setresgid(CHILD_GID, CHILD_GID, CHILD_GID)
        os.setresuid(CHILD_UID, CHILD_UID, CHILD_UID)
        if os.getresuid() != (CHILD_UID,) * 3 or os.getresgid() != (CHILD_GID,) * 3 or os.getgroups():
            raise PermissionError("the sympy child did not become the unprivileged user")
        try:
            os.setuid(0)
        except PermissionError:
            pass
        else:
            raise PermissionError("the sympy child could switch back to root")
    _limit(resource.RLIMIT_NPROC, 0)  # after the switch: the count is per (real) user


def _warm_up_once() -> None:
    """Let sympy/pylatexenc finish their lazy imports here, where the packages are surely readable."""
    global _warmed_up
    with _warm_lock:
        if not _warmed_up:
            _warmed_up = True
            try:
                warm_up()
            except Exception:  # noqa: BLE001 - only an optimisation; the children still work without it
                logger.warning("math reward: the sympy warm-up failed", exc_info=True)


def _sympy_equal_any(answer: str, truths: list[str], timeout: float) -> bool:
    """:func:`.math_symbolic.grade_answer` against each truth in a forked, confined child, killed (with its
    process group) at the deadline.

    A child process rather than a signal or thread: sympy can sit in C code (e.g. ``(10^9)!``) that neither
    interrupts. Its own group so that nothing it might start outlives it. Before grading, the child confines
    itself (:func:`_confine_child`); if that fails, the answer counts as not equal (and a warning is logged
    once), never as graded by an unconfined child.
    """
    global _setup_failure_reported
    _warm_up_once()
    cpu_seconds = math.ceil(timeout) + 2  # a backstop should the parent never kill it; the deadline comes first
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: must never return into the caller's stack
        verdict = _SETUP_FAILED
        try:
            os.close(read_fd)
            os.setpgid(0, 0)
            _confine_child(write_fd, cpu_seconds)
            verdict = _NOT_EQUAL
            if any(grade_answer(answer, truth) for truth in truths):
                verdict = _EQUAL
        except BaseException:
            pass
        try:
            os.write(write_fd, verdict)
        finally:
            os._exit(0)
    os.close(write_fd)
    with contextlib.suppress(OSError):
        os.setpgid(pid, pid)  # also from the parent, so the group exists before any killpg below
    try:
        ready, _, _ = select.select([read_fd], [], [], timeout)
        verdict = os.read(read_fd, 1) if ready else b""
    finally:
        os.close(read_fd)
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)  # before waitpid, while the group id cannot have been reused
        os.waitpid(pid, 0)
    if verdict == _SETUP_FAILED and not _setup_failure_reported:
        _setup_failure_reported = True
        logger.warning(
            "math reward: the sympy child could not confine itself (limits, or switching to uid %d); "
            "symbolic comparisons count as not equal",
            CHILD_UID,
        )
    return verdict == _EQUAL


def score_math(solution_str: str, ground_truth: Any, *, format_penalty: float = 0.0) -> dict[str, Any]:
    """Score one math response: 1.0 if its boxed answer matches any ground truth, 0.0 if not.

    A format error (unfinished ``<think>``, or no boxed answer) scores ``format_penalty``. ``ground_truth``
    is a string, a number, or a list of acceptable answers (a JSON-encoded list of strings works too).

    >>> score_math("<think>2+2</think> The answer is $\\\\boxed{4}$.", 4)["outcome"]
    'pass'
    """
    start = time.monotonic()
    truths = _ground_truths(ground_truth)  # validate first, so a broken dataset row fails on every response
    text = solution_str or ""
    if len(text) > MAX_RESPONSE_CHARS:
        text = ""  # a format error, decided without a scan
    if "</think>" in text:
        answer = _extract_boxed(text.rsplit("</think>", 1)[1])
    elif "<think>" in text:
        answer = None  # the model never finished thinking; a box inside the thoughts does not count
    else:
        answer = _extract_boxed(text)

    if not answer:
        score, passed, outcome = float(format_penalty), False, "format_error"
    elif len(answer) > MAX_ANSWER_CHARS:
        score, passed, outcome = 0.0, False, "wrong_answer"  # not normalised: hostile input stays cheap
    else:
        verdicts = [_cheap_equal(answer, truth) for truth in truths]
        undecided = [truth for truth, verdict in zip(truths, verdicts) if verdict is None]
        passed = any(verdicts) or (bool(undecided) and _sympy_equal_any(answer, undecided, SYMPY_TIMEOUT_S))
        score, outcome = (1.0, "pass") if passed else (0.0, "wrong_answer")
    return {
        "score": score,
        "passed": passed,
        "tests_run": 1 if answer else 0,
        "tests_total": 1,
        "outcome": outcome,
        "format_ok": bool(answer),
        "time_s": time.monotonic() - start,
        "answer": (answer or "")[:ANSWER_CHARS],
    }
