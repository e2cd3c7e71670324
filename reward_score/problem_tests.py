"""Tests stored by problem id, so a sample's ground truth can be ``{"problem_id": ...}`` instead of megabytes
of test data copied into every row and every Ray message (only the id and the code travel).

The store is one SQLite file (the data tooling writes it; readers open it read-only and look rows up lazily
with a bounded LRU cache). Inline ground truths keep working: only a JSON object whose keys are
``problem_id`` (and optionally ``store``) is treated as a reference.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

TEST_STORE_ENV = "VERL_PIPE_TEST_STORE"
_SCHEMA = "CREATE TABLE IF NOT EXISTS tests (problem_id TEXT PRIMARY KEY, data_source TEXT, ground_truth TEXT NOT NULL)"


@dataclass(frozen=True)
class TestRef:
    problem_id: str
    store: str | None = None


def parse_reference(ground_truth: Any) -> TestRef | None:
    """A :class:`TestRef` when ``ground_truth`` points into a store, else None (an inline ground truth)."""
    value = ground_truth
    if isinstance(value, str):
        stripped = value.lstrip()
        if not stripped.startswith("{") or '"problem_id"' not in stripped[:200]:
            return None
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if isinstance(value, Mapping) and "problem_id" in value and set(value) <= {"problem_id", "store"}:
        return TestRef(str(value["problem_id"]), value.get("store"))
    return None


def write_test_store(path: str, rows: Iterable[tuple[str, str, Any]]) -> int:
    """Write ``(problem_id, data_source, ground_truth)`` rows (ground truth: JSON text or a JSON-able value);
    replaces rows with the same id. Returns the number written."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    count = 0
    with sqlite3.connect(path) as db:
        db.execute(_SCHEMA)
        for problem_id, data_source, ground_truth in rows:
            text = ground_truth if isinstance(ground_truth, str) else json.dumps(ground_truth)
            db.execute("INSERT OR REPLACE INTO tests VALUES (?, ?, ?)", (str(problem_id), data_source, text))
            count += 1
    return count


class ProblemTestStore:
    """Read-only, thread-safe lookups with an LRU cache of ``cache_size`` ground truths."""

    def __init__(self, path: str, cache_size: int = 4096):
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"test store {path!r} does not exist: build it with `verl-pipe data prepare` or point "
                f"{TEST_STORE_ENV} / reward_kwargs.test_store at the right file"
            )
        self.path = path
        self.cache_size = cache_size
        self._cache: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()
        self._local = threading.local()

    def _db(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, check_same_thread=False)
            self._local.db = db
        return db

    def get(self, problem_id: str) -> str:
        with self._lock:
            if problem_id in self._cache:
                self._cache.move_to_end(problem_id)
                return self._cache[problem_id]
        row = self._db().execute("SELECT ground_truth FROM tests WHERE problem_id = ?", (problem_id,)).fetchone()
        if row is None:
            raise KeyError(f"problem {problem_id!r} is not in the test store {self.path!r}")
        with self._lock:
            self._cache[problem_id] = row[0]
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return row[0]

    def __len__(self) -> int:
        return self._db().execute("SELECT COUNT(*) FROM tests").fetchone()[0]


_stores: dict[str, ProblemTestStore] = {}
_stores_lock = threading.Lock()


def open_store(path: str) -> ProblemTestStore:
    """One shared :class:`ProblemTestStore` per path in this process."""
    path = os.path.abspath(path)
    with _stores_lock:
        if path not in _stores:
            _stores[path] = ProblemTestStore(path)
        return _stores[path]


def resolve_ground_truth(ground_truth: Any, store_path: str | None = None) -> Any:
    """The inline ground truth, looked up in the store when ``ground_truth`` is a reference."""
    ref = parse_reference(ground_truth)
    if ref is None:
        return ground_truth
    path = ref.store or store_path or os.environ.get(TEST_STORE_ENV)
    if not path:
        raise ValueError(
            f"ground_truth references problem {ref.problem_id!r} but no test store is configured: set "
            f"reward_kwargs.test_store, {TEST_STORE_ENV}, or a 'store' key in the reference"
        )
    return open_store(path).get(ref.problem_id)
