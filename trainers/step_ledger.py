"""The pipelined trainers' ledger: one JSON line per step, appended to ``trainer.v1.<mode>.ledger_path``.

Each line holds the prompts the step took from the sampler and those it trained (by dataset ``index``, so a
resumed run can be compared with an uninterrupted one), the policy versions that generated its samples and the
step's ``pipeline/*`` metrics.
"""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import transfer_queue as tq

from verl_pipe.trainers.token_lag import version_number

logger = logging.getLogger("verl_pipe")


class StepLedger:
    def __init__(self, path: str, mode: str):
        self.path = path
        self.mode = mode
        self._warned_no_index = False

    def write(self, step: int, partition_id: str, trained_keys, consumed_keys, consumed_tags, metrics,
              dropped_uniform: list[tuple] = ()) -> None:  # fmt: skip
        """``dropped_uniform``: (prompt id, shared reward) of each group dynamic sampling dropped and refilled (no
        longer in TransferQueue: the buffer read their ids before it cleared them)."""
        record = {
            "step": step,
            "mode": self.mode,
            "trainer_version": step - 1,
            # every prompt this step took from the sampler, and those that reached the update after the filters
            "prompts": self.prompt_ids(consumed_keys, partition_id) + [prompt for prompt, _ in dropped_uniform],
            "prompts_trained": self.prompt_ids(trained_keys, partition_id),
            "prompts_dropped_uniform": [[prompt, value] for prompt, value in dropped_uniform],
            "sample_versions": sorted(
                {(version_number(t["min_global_steps"]), version_number(t["max_global_steps"])) for t in consumed_tags}
            ),
            "metrics": {k: float(v) for k, v in metrics.items() if k.startswith("pipeline/")},
        }
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")

    def prompt_ids(self, keys: list[str], partition_id: str) -> list:
        """Dataset identity of each prompt group among ``keys`` (``index`` of the dataset row, else the uid)."""
        try:
            return list(prompt_ids_by_uid(keys, partition_id).values())
        except Exception as error:  # noqa: BLE001 - datasets without an index column are identified by uid
            if not self._warned_no_index:
                self._warned_no_index = True
                logger.warning(
                    "verl-pipe: the ledger identifies prompts by uid (no dataset 'index' field: %s: %s); uids "
                    "differ between a run and its resume",
                    type(error).__name__,
                    error,
                )
            return sorted({key.split("_")[0] for key in keys})


def prompt_ids_by_uid(keys: list[str], partition_id: str) -> dict[str, int]:
    """uid -> the dataset row's ``index`` of each prompt group among ``keys`` (sample keys ``<uid>_<sample>_<turn>``),
    in uid order, read from TransferQueue; raises when the data has no ``index`` field."""
    first_keys: dict[str, str] = {}
    for key in keys:
        first_keys.setdefault(key.split("_")[0], key)
    uids = sorted(first_keys)
    if not uids:
        return {}
    data = tq.kv_batch_get(keys=[first_keys[uid] for uid in uids], partition_id=partition_id, select_fields=["index"])
    return dict(zip(uids, (int(i) for i in np.asarray(data["index"]).reshape(-1).tolist())))
