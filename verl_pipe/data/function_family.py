"""A generated family of one-function coding problems: many items, each with its own constants and tests.

For learning runs (``bench learn`` and a demo whose curve rises) the task must have enough validation
items for a tight interval and sit where SmolLM2-135M-Instruct is weak but not hopeless. On the embedded set it
passes 14 of 50 problems greedily, 8 at temperature 0.7 and 2 at 1.0, and the passes are LeetCode-style
``class Solution`` functions; it passes none of the stdin programs. So each item here is such a function: a
template (``Family``) with constants drawn per item (``x * 7 + 3``, "greater than 12", "repeated 4 times").
On the first 64 validation items of ``split_function_problems(200, 120)`` (HF generation, 160 tokens, bf16) it
passes 23 greedily and 14 at temperature 0.7, from all 7 ``count_letter`` items greedily to none of ``clamp`` and
``scaled_sum``: room to learn, and a reward signal in most groups.

Rows follow the embedded set's schema (DeepCoder-Preview-Dataset fields plus ``reference_solution``), graded by
the same ``verl_pipe/easy_code`` source, so everything downstream (the converter, the reward, ``verify``) applies
unchanged. Expected outputs come from the family's trusted Python implementation, never from model code.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

TESTS_PER_ITEM = 5


@dataclass(frozen=True)
class Family:
    name: str  # the function's name (``func_name``); items of a family differ in their constants
    signature: str  # parameters and return type, as in the starter code
    statement: str  # what to return, with ``{}`` fields for the constants
    body: str  # the reference solution's return expression, with the same fields
    constants: Callable[[random.Random], dict[str, Any]]
    arguments: Callable[[random.Random], list[Any]]  # one test's arguments
    expected: Callable[[dict[str, Any], list[Any]], Any]  # the trusted answer for those arguments


def _ints(rng: random.Random, low: int = -20, high: int = 20) -> list[int]:
    return [rng.randint(low, high) for _ in range(rng.randint(0, 6))]


def _word(rng: random.Random) -> str:
    return "".join(rng.choice("abcdeilnorst") for _ in range(rng.randint(0, 7)))


FAMILIES: tuple[Family, ...] = (
    Family("affine", "x: int) -> int", "Return x multiplied by {a}, plus {b}.", "x * {a} + {b}",
           lambda r: {"a": r.randint(2, 9), "b": r.randint(1, 20)}, lambda r: [r.randint(-50, 50)],
           lambda c, args: args[0] * c["a"] + c["b"]),
    Family("shift_all", "nums: List[int]) -> List[int]", "Return a new list with {k} added to every number of nums.",
           "[x + {k} for x in nums]", lambda r: {"k": r.randint(1, 60)}, lambda r: [_ints(r)],
           lambda c, args: [x + c["k"] for x in args[0]]),
    Family("count_greater", "nums: List[int]) -> int", "Return how many numbers in nums are greater than {t}.",
           "sum(1 for x in nums if x > {t})", lambda r: {"t": r.randint(-30, 30)}, lambda r: [_ints(r)],
           lambda c, args: sum(1 for x in args[0] if x > c["t"])),
    Family("keep_multiples", "nums: List[int]) -> List[int]",
           "Return the numbers of nums that are divisible by {k}, in their original order.",
           "[x for x in nums if x % {k} == 0]", lambda r: {"k": r.randint(2, 20)}, lambda r: [_ints(r)],
           lambda c, args: [x for x in args[0] if x % c["k"] == 0]),
    Family("scaled_sum", "nums: List[int]) -> int", "Return the sum of the numbers in nums, multiplied by {k}.",
           "sum(nums) * {k}", lambda r: {"k": r.randint(2, 40)}, lambda r: [_ints(r)],
           lambda c, args: sum(args[0]) * c["k"]),
    Family("repeat_text", "s: str) -> str", "Return the string s repeated {k} times.", "s * {k}",
           lambda r: {"k": r.randint(2, 20)}, lambda r: [_word(r)], lambda c, args: args[0] * c["k"]),
    Family("count_letter", "s: str) -> int", "Return how many times the letter '{ch}' occurs in s.",
           "s.count('{ch}')", lambda r: {"ch": r.choice("abcdefghijklmnopqrstuvwxyz")}, lambda r: [_word(r)],
           lambda c, args: args[0].count(c["ch"])),
    Family("clamp", "x: int) -> int", "Return x if it lies between {lo} and {hi}; {lo} if it is smaller; {hi} if larger.",
           "min(max(x, {lo}), {hi})", lambda r: {"lo": (lo := r.randint(-20, 0)), "hi": lo + r.randint(5, 30)},
           lambda r: [r.randint(-60, 60)], lambda c, args: min(max(args[0], c["lo"]), c["hi"])),
)  # fmt: skip


def _item(family: Family, constants: dict[str, Any], rng: random.Random, problem_id: str) -> dict[str, Any]:
    cases = [family.arguments(rng) for _ in range(TESTS_PER_ITEM)]
    tests = [
        {"input": "\n".join(json.dumps(arg) for arg in args), "output": json.dumps(family.expected(constants, args)),
         "testtype": "functional"}
        for args in cases
    ]  # fmt: skip
    call = f"{family.name}({', '.join(repr(arg) for arg in cases[0])})"
    header = f"def {family.name}(self, {family.signature}:"
    statement = family.statement.format(**constants)
    return {
        "problem": f"Implement {family.name}({family.signature}. {statement}\n\n"
        f"Example: {call} returns {tests[0]['output']}",
        "tests": json.dumps(tests),
        "starter_code": f"class Solution:\n    {header}\n        ",
        "metadata": json.dumps({"func_name": family.name, "problem_id": problem_id, "difficulty": "easy",
                                "family": family.name, "constants": constants}),  # fmt: skip
        "reference_solution": "from typing import List\n\n\nclass Solution:\n"
        f"    {header}\n        return {family.body.format(**constants)}\n",
    }


def generate_function_problems(count: int, seed: int = 0) -> list[dict[str, Any]]:
    """``count`` distinct items, families in turn, constants and tests drawn from ``seed``; the same call
    returns the same items. Raises when the families cannot make that many distinct items."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    rng = random.Random(seed)
    items, seen = [], set()
    attempts = misses = 0
    while len(items) < count:
        attempts += 1
        family = FAMILIES[attempts % len(FAMILIES)]  # in turn; a family out of new constants is passed over
        constants = family.constants(rng)
        key = (family.name, json.dumps(constants, sort_keys=True))
        if key in seen:
            misses += 1
            if misses > 100 * len(FAMILIES):
                raise ValueError(f"the {len(FAMILIES)} families made only {len(items)} distinct items; ask for fewer")
            continue
        misses = 0
        seen.add(key)
        items.append(_item(family, constants, rng, f"gen-{family.name}-{len(items):04d}"))
    return items


def split_function_problems(train: int, val: int, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """Train and validation items with no (family, constants) in common."""
    items = generate_function_problems(train + val, seed)
    rng = random.Random(seed + 1)
    order = list(range(len(items)))
    rng.shuffle(order)
    return [items[i] for i in sorted(order[val:])], [items[i] for i in sorted(order[:val])]


def interleave_families(items: list[dict]) -> list[dict]:
    """The items round-robin by family (the first of each family, then the second of each, ...), so that a
    sequential batch of ``len(FAMILIES)`` items holds one of each for as long as every family has items left.
    Without it a batch's mean reward swings with its family mix (SmolLM2 solves every ``count_letter`` item and
    no ``clamp`` one), hiding the learning in a short run's curve."""
    by_family: dict[str, list[dict]] = {}
    for item in items:
        by_family.setdefault(json.loads(item["metadata"])["family"], []).append(item)
    queues = [by_family[f.name] for f in FAMILIES if f.name in by_family]
    return [queue[i] for i in range(max(map(len, queues), default=0)) for queue in queues if i < len(queue)]


def write_function_dataset(
    out_dir: str, train: int = 200, val: int = 120, seed: int = 0, interleave: bool = False
) -> tuple[str, str]:
    """Write ``train.parquet`` and ``val.parquet`` of :func:`split_function_problems` under ``out_dir`` in verl's
    row format (the embedded set's converter and data source), and return their paths. ``interleave``: training
    items in :func:`interleave_families` order, for a run that reads them in order (``data.shuffle=False``)."""
    import os

    from .convert import write_parquet
    from .embedded import to_verl_rows

    os.makedirs(out_dir, exist_ok=True)
    train_items, val_items = split_function_problems(train, val, seed)
    if interleave:
        train_items = interleave_families(train_items)
    return (
        write_parquet(to_verl_rows(train_items, split="train"), os.path.join(out_dir, "train.parquet")),
        write_parquet(to_verl_rows(val_items, split="val"), os.path.join(out_dir, "val.parquet")),
    )
