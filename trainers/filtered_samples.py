"""What the sample filters took out of one step's batches, from the filtering until the step's metrics are out.

The filters themselves are :mod:`.sample_filters`. The dropped samples stay in TransferQueue (verl clears only
the keys of the batch it trains), count in the step's ``pipeline/filter/*`` metrics and in the ledger's
prompts consumed, and are cleared once the step's metrics are written. A batch the filters emptied goes on as
one dropped sample tagged as padding (the stand-in): verl clears it with the batch, and the trainer skips the
optimizer step.
"""

from __future__ import annotations

from collections import Counter

import transfer_queue as tq
from transfer_queue import KVBatchMeta

from verl_pipe.trainers.config import PipelineConfig
from verl_pipe.trainers.sample_filters import filter_batch, is_padding_only, stand_in_batch


class FilteredSamples:
    def __init__(self):
        self._start_step()

    def _start_step(self) -> None:
        self.counts: Counter = Counter()  # this step's pipeline/filter/* counts
        self.dropped_keys: list[str] = []  # cleared from TransferQueue after the step's metrics
        self.dropped_tags: list[dict] = []
        self.stand_in_keys: list[str] = []  # dropped samples passed through an emptied batch (tagged padding)

    def filter(self, batch: KVBatchMeta, cfg: PipelineConfig, trainer_version: int) -> KVBatchMeta:
        """The batch's samples that go on to the forward passes, or its stand-in if none does."""
        result = filter_batch(batch, cfg, trainer_version=trainer_version)
        self.counts.update(result.counts)
        self.dropped_keys.extend(result.dropped_keys)
        dropped = set(result.dropped_keys)
        self.dropped_tags.extend(tag for key, tag in zip(batch.keys, batch.tags) if key in dropped)
        if len(result.batch):
            return result.batch
        stand_in = stand_in_batch(batch, result.dropped_keys)
        self.dropped_keys.remove(stand_in.keys[0])  # verl clears it with the batch it passes through
        self.stand_in_keys.extend(stand_in.keys)
        return stand_in

    def skip_update(self) -> None:
        """Count an optimizer step skipped because the filters left only padding."""
        self.counts["filter/updates_skipped"] += 1

    def batch_for_verl_metrics(self, batch: KVBatchMeta) -> KVBatchMeta:
        """``batch``, or, when the filters left it only padding, the batch with its stand-in counted as real.

        verl's step metrics reduce over the real samples and fail on none; a step that trained nothing reports
        them for its stand-in sample (a real dropped one), and ``pipeline/filter/updates_skipped`` marks it.
        """
        if not self.stand_in_keys or not is_padding_only(batch):
            return batch
        stand_ins = set(self.stand_in_keys)
        tags = [dict(tag, is_padding=False) if key in stand_ins else tag for key, tag in zip(batch.keys, batch.tags)]
        return KVBatchMeta(
            keys=batch.keys, tags=tags, partition_id=batch.partition_id, fields=batch.fields, extra_info=batch.extra_info
        )

    def consumed(self, trained_keys: list[str], trained_tags: list[dict]) -> tuple[list[str], list[dict]]:
        """Keys and tags of every sample this step took from the sampler: trained, dropped, and stand-ins."""
        return trained_keys + self.dropped_keys + self.stand_in_keys, trained_tags + self.dropped_tags

    def count_metrics(self) -> dict[str, float]:
        metrics = {f"pipeline/{name}": float(count) for name, count in sorted(self.counts.items())}
        metrics.setdefault("pipeline/filter/updates_skipped", 0.0)
        return metrics

    def clear(self, partition_id: str) -> None:
        """After the step's metrics: clear the dropped samples from TransferQueue and start the next step."""
        if self.dropped_keys:  # verl clears the keys of the batch it trained; the dropped ones are ours
            tq.kv_clear(keys=self.dropped_keys, partition_id=partition_id)
        self._start_step()
