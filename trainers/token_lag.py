"""Per-token policy lag of a trained batch: how many versions behind the trainer each response token was sampled.

At step k the trainer holds v_{k-1}; a token sampled by v_j has lag (k - 1) - j. A sample's tokens carry their
versions (``token_versions``, when an in-flight update fell inside the answer) or all share the sample's version
(``max_global_steps``). The metrics weigh every token equally, so one long response that spanned an update
counts for its length, not as one sample. A version may be a fraction of a step: ``in_flight_pipeline`` can load
the weights of each minibatch update (v_{k-1} + m / M after the m-th of a step's M updates).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

# The benchmark rollout server's extra field of (modelled tokens, version) runs (verl_pipe.bench.replica_model).
MODELLED_RUNS_KEY = "modelled_token_versions"


def version_number(value: Any) -> float | int:
    """A version tag as a number for records and metric names: a whole step stays an int, a fraction a float."""
    number = float(value)
    return int(number) if number.is_integer() else round(number, 4)


@dataclass
class SampleVersions:
    response_len: int
    version: float  # the sample's freshest version (max_global_steps)
    token_versions: Optional[Sequence[float]] = None  # one per response token, when they differ
    # How many tokens each one stands for (the benchmark's real tokens carry modelled responses of other lengths).
    weight_per_token: float = 1.0
    # The benchmark's own account, when its rollout server gave one: (modelled tokens, version) runs. It replaces
    # the real tokens' versions, whose shares drift from the modelled ones when a sync cuts a request (verl
    # resumes it with a fresh real generation of any length).
    modelled_runs: Optional[Sequence[tuple[float, float]]] = None

    def versions(self) -> list[float]:
        if self.modelled_runs:
            return [float(version) for _, version in self.modelled_runs]
        if self.token_versions:
            return [float(v) for v in self.token_versions[: self.response_len]]
        return [float(self.version)] * self.response_len

    def weighted_versions(self) -> list[tuple[float, float]]:
        """(version, weight) of every token, or of every modelled run."""
        if self.modelled_runs:
            return [(float(version), float(count)) for count, version in self.modelled_runs]
        return [(version, self.weight_per_token) for version in self.versions()]


def sample_versions(
    tag: dict[str, Any], extra_fields: Optional[dict[str, Any]], modelled: bool = False
) -> SampleVersions:
    """A trained sample's versions from its TransferQueue tag and extra fields; ``modelled``: weigh its tokens by the
    modelled response length the benchmark's rollout server reported."""
    extra = extra_fields or {}
    length = int(tag.get("response_len", 0))
    weight = 1.0
    if modelled and extra.get("modelled_response_tokens") is not None and length > 0:
        weight = float(extra["modelled_response_tokens"]) / length
    runs = [(float(count), float(version)) for count, version in extra.get(MODELLED_RUNS_KEY) or []] if modelled else []
    return SampleVersions(length, float(tag["max_global_steps"]), extra.get("token_versions"), weight, runs or None)


def token_lag_metrics(samples: Sequence[SampleVersions], trainer_version: float, prefix: str) -> dict[str, float]:
    """Token-weighted mean lag, max lag, and the share of samples whose tokens span more than one version."""
    lags = [(trainer_version - v, weight) for s in samples for v, weight in s.weighted_versions()]
    spanning = [len(set(s.versions())) > 1 for s in samples]
    weight = sum(w for _, w in lags)
    if not lags or weight <= 0:
        return {}
    return {
        f"{prefix}/token_lag/mean": sum(lag * w for lag, w in lags) / weight,
        f"{prefix}/token_lag/max": float(max(lag for lag, _ in lags)),
        f"{prefix}/token_lag/min": float(min(lag for lag, _ in lags)),
        f"{prefix}/spanning_samples_share": sum(spanning) / len(spanning),
    }
