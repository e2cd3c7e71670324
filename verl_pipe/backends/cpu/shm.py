"""Shared-memory segments a verl job leaves behind on the host.

verl's weight sender puts each bucket in a named segment (``/dev/shm/psm_*``) and unlinks it when it closes; a job
that ends by Ray killing its actors never closes it, and each vLLM run would leave a few hundred MB in /dev/shm
(RAM) until the machine restarts.
"""

from __future__ import annotations

import contextlib
import glob
import os
from typing import Iterator

WEIGHT_BUCKETS = "/dev/shm/psm_*"


@contextlib.contextmanager
def removing_leaked_weight_buckets() -> Iterator[None]:
    """Around a whole verl job: once it is over, remove the weight-bucket segments that appeared while it ran
    (nothing reads them after the job; segments older than it are left alone)."""
    before = set(glob.glob(WEIGHT_BUCKETS))
    try:
        yield
    finally:
        for path in set(glob.glob(WEIGHT_BUCKETS)) - before:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
