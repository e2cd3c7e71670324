"""Dry runs of the GPU recipes in ``recipes/``: compose, validate and summarise a run without a GPU or Ray.

Each recipe script builds one hydra override list and hands it either to verl's stock entrypoint or here::

    python -m verl.trainer.main_ppo "${OVERRIDES[@]}"                                   # the run
    python -m verl_pipe.recipe_check dry-run [--json] [--recipe NAME --stage N --stages 16384,32768] \\
        [--cluster-gpus 32] -- "${OVERRIDES[@]}"                                         # DRY_RUN=1

The dry run goes through the checks the real run meets before (or soon after) its GPUs are busy:

1. hydra composes verl's own ``ppo_trainer.yaml`` with the same overrides (misspelled keys, missing presets);
2. verl's dataclasses are built from it: the actor (with GRPO+'s start-up checks) and the rollout config;
3. verl's ``validate_config``, exactly as ``main_ppo`` calls it before Ray starts;
4. the trainer mode is looked up in verl's registry; a pipelined mode's ``trainer.v1.<mode>`` section goes through
   :class:`verl_pipe.trainers.config.PipelineConfig` and the mode's own layout checks;
5. the rollout replica, server, checkpoint engine and agent-loop client the run builds are resolved for the platform
   it names (``trainer.device``; ``VERL_PLATFORM=cpu``), as the trainer resolves them, and printed; a combination
   that fails only once the workers are up (in-flight loads on a replica without them, the ``hf`` rollout on a
   GPU, the ``naive`` engine between separate pools) stops here;
6. the reward function loads and the reward manager is registered (reward workers meet both only after the
   first batch is generated);
7. layout checks no config class makes, which otherwise fail only after the first long generation (tensor
   parallel replicas that do not tile a pool, a token budget shorter than one sequence, pools larger than the
   cluster).

Any failure exits with status 2 and one message that names the key to change.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import re
import sys
import typing
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Optional

from verl_pipe.trainer_modes import plugin_modes

_KEY_IN_TEXT = re.compile(r"((?:trainer|actor_rollout_ref|data|algorithm|critic|reward)\.[\w.]+)")


class RecipeConfigError(ValueError):
    """A recipe's config cannot run; ``key`` is the setting to change (the message names it too)."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class RecipeContext:
    """What the recipe script knows and the composed config does not."""

    recipe: str = "custom"
    stage: int = 1
    # Response length of every stage of the recipe's context-lengthening schedule, in order.
    stage_lengths: tuple[int, ...] = ()
    # NNODES x GPUS_PER_NODE of the cluster the script was told about; None skips the fit check.
    cluster_gpus: Optional[int] = None
    # Warn about model and data paths missing on this machine (off where the real run builds them first).
    check_paths: bool = True


@dataclass(frozen=True)
class GpuLayout:
    """Where the trainer and the samplers run. In hybrid (``sync``) mode the samplers share the trainer's GPUs."""

    trainer_mode: str
    hybrid_engine: bool
    trainer_nodes: int
    trainer_gpus_per_node: int
    sampler_nodes: int  # 0 when hybrid: the rollout replicas live on the trainer GPUs
    sampler_gpus_per_node: int
    rollout_tp: int
    ulysses_sp: int

    @property
    def trainer_gpus(self) -> int:
        return self.trainer_nodes * self.trainer_gpus_per_node

    @property
    def sampler_gpus(self) -> int:
        return self.sampler_nodes * self.sampler_gpus_per_node

    @property
    def total_gpus(self) -> int:
        return self.trainer_gpus + self.sampler_gpus

    @property
    def rollout_replicas(self) -> int:
        return (self.trainer_gpus if self.hybrid_engine else self.sampler_gpus) // max(self.rollout_tp, 1)

    @property
    def trainer_dp(self) -> int:
        return self.trainer_gpus // max(self.ulysses_sp, 1)

    def to_dict(self) -> dict[str, Any]:
        derived = ("trainer_gpus", "sampler_gpus", "total_gpus", "rollout_replicas", "trainer_dp")
        return {**asdict(self), **{name: getattr(self, name) for name in derived}}

    def describe(self, unit: str = "GPUs") -> str:
        trainer = f"trainer {self.trainer_nodes}x{self.trainer_gpus_per_node}={self.trainer_gpus}"
        trainer += f" (Ulysses SP {self.ulysses_sp} -> DP {self.trainer_dp})"
        replicas = f"{self.rollout_replicas} rollout replicas x TP {self.rollout_tp}"
        if self.hybrid_engine:
            return f"{trainer}, rollout on the same {unit} ({replicas}) = {self.total_gpus} {unit}"
        sampler = f"sampler {self.sampler_nodes}x{self.sampler_gpus_per_node}={self.sampler_gpus} ({replicas})"
        return f"{trainer} + {sampler} = {self.total_gpus} {unit}"


def _key(path: str) -> Any:
    return field(metadata={"key": path})


@dataclass
class RecipeSummary:
    """The resolved settings a reader checks before spending GPU hours; ``--json`` prints it as is.

    Fields with a ``key`` are read from the composed config with their declared type, so a value of the wrong
    type (``rollout.n=x``) stops the dry run naming that key.
    """

    recipe: str
    stage: int
    stages: list[int]
    model: str = _key("actor_rollout_ref.model.path")
    train_files: Any = _key("data.train_files")
    val_files: Any = _key("data.val_files")
    max_prompt_length: int = _key("data.max_prompt_length")
    max_response_length: int = _key("data.max_response_length")
    n: int = _key("actor_rollout_ref.rollout.n")
    val_n: int = _key("actor_rollout_ref.rollout.val_kwargs.n")
    temperature: float = _key("actor_rollout_ref.rollout.temperature")
    val_temperature: float = _key("actor_rollout_ref.rollout.val_kwargs.temperature")
    rollout_name: str = _key("actor_rollout_ref.rollout.name")
    lr: float = _key("actor_rollout_ref.actor.optim.lr")
    grad_clip: float = _key("actor_rollout_ref.actor.grad_clip")
    ppo_epochs: int = _key("actor_rollout_ref.actor.ppo_epochs")
    adv_estimator: str = _key("algorithm.adv_estimator")
    loss_mode: str = _key("actor_rollout_ref.actor.policy_loss.loss_mode")
    loss_agg_mode: str = _key("actor_rollout_ref.actor.loss_agg_mode")
    clip_ratio_low: float = _key("actor_rollout_ref.actor.clip_ratio_low")
    clip_ratio_high: float = _key("actor_rollout_ref.actor.clip_ratio_high")
    entropy_coeff: float = _key("actor_rollout_ref.actor.entropy_coeff")
    use_kl_loss: bool = _key("actor_rollout_ref.actor.use_kl_loss")
    kl_loss_coef: float = _key("actor_rollout_ref.actor.kl_loss_coef")
    use_kl_in_reward: bool = _key("algorithm.use_kl_in_reward")
    overlong_filter: Optional[str] = _key("actor_rollout_ref.actor.policy_loss.overlong_filter")  # GRPO+ only
    train_batch_size: int = _key("data.train_batch_size")
    ppo_mini_batch_size: int = _key("actor_rollout_ref.actor.ppo_mini_batch_size")
    use_dynamic_bsz: bool = _key("actor_rollout_ref.actor.use_dynamic_bsz")
    ppo_max_token_len_per_gpu: int = _key("actor_rollout_ref.actor.ppo_max_token_len_per_gpu")
    use_v1: bool = _key("trainer.use_v1")
    device: str = _key("trainer.device")
    weight_sync: str = _key("actor_rollout_ref.rollout.checkpoint_engine.backend")
    reward_path: Optional[str] = _key("reward.custom_reward_function.path")  # None: verl's default_compute_score
    reward_name: Optional[str] = _key("reward.custom_reward_function.name")
    reward_manager: str = _key("reward.reward_manager.name")
    checkpoint_dir: str = _key("trainer.default_local_dir")
    save_contents: list[str] = _key("actor_rollout_ref.actor.checkpoint.save_contents")
    save_freq: int = _key("trainer.save_freq")
    test_freq: int = _key("trainer.test_freq")
    total_epochs: int = _key("trainer.total_epochs")
    trainer_mode: str = "sync"  # "legacy" when trainer.use_v1=false
    parameter_sync_step: Optional[int] = None  # pipelined modes: optimizer steps between weight syncs
    layout: dict[str, Any] = field(default_factory=dict)
    # the rollout classes the run builds, on the platform it names (verl_pipe.rollout.composition)
    rollout_classes: dict[str, Any] = field(default_factory=dict)
    cluster_gpus: Optional[int] = None
    checks: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


# --- reading the config -----------------------------------------------------------------------------------------


def verl_config_dir() -> str:
    """verl's ``trainer/config`` folder, found without importing verl (that import costs seconds: torch)."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise RecipeConfigError("verl", "verl is not installed: pip install 'verl[verl-core]>=0.9.1,<0.10'")
    return os.path.join(list(spec.submodule_search_locations)[0], "trainer", "config")


def _error_chain(error: Optional[BaseException]) -> list[BaseException]:
    chain: list[BaseException] = []
    while error is not None and all(error is not seen for seen in chain):
        chain.append(error)
        error = error.__cause__ or error.__context__
    return chain


def compose_config(overrides: list[str]):
    """Compose verl's ``ppo_trainer`` config as ``python -m verl.trainer.main_ppo OVERRIDES`` would."""
    from hydra import compose, initialize_config_dir

    try:
        with initialize_config_dir(config_dir=verl_config_dir(), version_base=None):
            return compose(config_name="ppo_trainer", overrides=list(overrides))
    except Exception as error:  # hydra's errors are many classes; each means "this override list is bad"
        texts = list(dict.fromkeys(str(e).strip() for e in _error_chain(error) if str(e).strip()))
        text = " | ".join(texts)
        key = "override"
        for pattern in (r"Could not override '([^']+)'", r"full_key: (\S+)", r"Could not find '([^']+)'"):
            match = re.search(pattern, text)
            if match:
                key = match.group(1)
                break
        raise RecipeConfigError(key, f"hydra could not compose the config: {text}") from error


def _get(config, key: str, hint: Any = Any, default: Any = None) -> Any:
    """``key``'s resolved value, converted to ``hint``; a value that does not convert names the key."""
    from omegaconf import OmegaConf

    try:
        value = OmegaConf.select(config, key, default=default)
        if OmegaConf.is_config(value):
            value = OmegaConf.to_container(value, resolve=True)
    except Exception as error:  # an interpolation that does not resolve (${...} to a missing key)
        raise RecipeConfigError(key, f"{key} does not resolve: {error}") from error
    optional = typing.get_origin(hint) is typing.Union and type(None) in typing.get_args(hint)
    if value is None and (optional or hint is Any):
        return None
    base = typing.get_args(hint)[0] if optional else hint
    try:
        if base is bool:
            if isinstance(value, bool) or value in (0, 1):
                return bool(value)
            raise ValueError("not true/false")
        if base in (int, float, str):
            return base(value)
        if typing.get_origin(base) is list:
            return list(value)
        return value
    except (TypeError, ValueError) as error:
        raise RecipeConfigError(key, f"{key}={value!r} is not a valid {getattr(base, '__name__', base)}") from error


def _build(config, key: str):
    """verl's own dataclass for one section; its __post_init__ checks (GRPO+'s included) run here."""
    from omegaconf import OmegaConf

    from verl.utils.config import omega_conf_to_dataclass

    try:
        return omega_conf_to_dataclass(OmegaConf.select(config, key))
    except Exception as error:
        # hydra wraps the dataclass's own error; its innermost message is the one that names the setting.
        root = str(_error_chain(error)[-1]).strip()
        unexpected = re.search(r"unexpected keyword argument '(\w+)'", root)
        if unexpected:  # a '+'-added key the strict dataclass does not have (hydra's struct check let it through)
            bad = f"{key}.{unexpected.group(1)}"
            raise RecipeConfigError(bad, f"{bad} is not a setting of verl's {key} config (misspelled?)") from error
        raise RecipeConfigError(key, f"verl's {key} config refused it: {root}") from error


# --- checks -----------------------------------------------------------------------------------------------------


def layout_of(config) -> GpuLayout:
    hybrid = _get(config, "actor_rollout_ref.hybrid_engine", bool, True)
    return GpuLayout(
        trainer_mode=_get(config, "trainer.v1.trainer_mode", str, "sync"),
        hybrid_engine=hybrid,
        trainer_nodes=_get(config, "trainer.nnodes", int),
        trainer_gpus_per_node=_get(config, "trainer.n_gpus_per_node", int),
        sampler_nodes=0 if hybrid else _get(config, "actor_rollout_ref.rollout.nnodes", int),
        sampler_gpus_per_node=0 if hybrid else _get(config, "actor_rollout_ref.rollout.n_gpus_per_node", int),
        rollout_tp=_get(config, "actor_rollout_ref.rollout.tensor_model_parallel_size", int),
        ulysses_sp=_get(config, "actor_rollout_ref.actor.ulysses_sequence_parallel_size", int, 1),
    )


def check_layout(config, layout: GpuLayout, ctx: RecipeContext) -> list[str]:
    """Checks no verl config class makes; returns warnings, raises on what cannot run."""
    warnings: list[str] = []
    tp_key = "actor_rollout_ref.rollout.tensor_model_parallel_size"
    pool_key = "trainer.n_gpus_per_node" if layout.hybrid_engine else "actor_rollout_ref.rollout.n_gpus_per_node"
    pool_gpn = layout.trainer_gpus_per_node if layout.hybrid_engine else layout.sampler_gpus_per_node
    if layout.rollout_tp < 1 or pool_gpn % layout.rollout_tp:
        raise RecipeConfigError(
            tp_key,
            f"{tp_key}={layout.rollout_tp} must divide {pool_key}={pool_gpn}: each rollout replica's "
            "tensor-parallel group lives on one node",
        )
    sp_key = "actor_rollout_ref.actor.ulysses_sequence_parallel_size"
    if layout.ulysses_sp < 1 or layout.trainer_gpus_per_node % layout.ulysses_sp:
        raise RecipeConfigError(
            sp_key, f"{sp_key}={layout.ulysses_sp} must divide trainer.n_gpus_per_node={layout.trainer_gpus_per_node}"
        )
    # verl's dynamic batching packs micro-batches of up to this many tokens per GPU (times the SP group) and
    # asserts that one whole sequence fits: too small a budget fails at the first long sample, i.e. only after
    # the first full generation.
    longest = _get(config, "data.max_prompt_length", int) + _get(config, "data.max_response_length", int)
    if _get(config, "actor_rollout_ref.actor.use_dynamic_bsz", bool):
        for key in ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
                    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu"):  # fmt: skip
            per_gpu = _get(config, key, int)
            if per_gpu * layout.ulysses_sp < longest:
                raise RecipeConfigError(
                    key,
                    f"{key}={per_gpu} x Ulysses SP {layout.ulysses_sp} = {per_gpu * layout.ulysses_sp} tokens is "
                    f"less than data.max_prompt_length + data.max_response_length = {longest}: a sequence won't fit",
                )
    if ctx.cluster_gpus is not None:
        if layout.total_gpus > ctx.cluster_gpus:
            raise RecipeConfigError(
                "trainer.nnodes / actor_rollout_ref.rollout.nnodes",
                f"the pools need {layout.total_gpus} GPUs ({layout.describe()}) but the cluster has "
                f"{ctx.cluster_gpus} (NNODES x GPUS_PER_NODE): shrink a pool or add nodes",
            )
        if layout.total_gpus < ctx.cluster_gpus:
            idle = ctx.cluster_gpus - layout.total_gpus
            warnings.append(f"{idle} of the cluster's {ctx.cluster_gpus} GPUs stay idle")
    return warnings


def check_trainer_mode(config, layout: GpuLayout) -> Optional[int]:
    """The mode must be in verl's registry; a pipelined mode also runs its own start-up checks.

    Returns the pipelined mode's ``parameter_sync_step`` (None for verl's own modes).
    """
    mode = layout.trainer_mode
    if not _get(config, "trainer.use_v1", bool, True):
        if mode != "sync":
            message = f"trainer.v1.trainer_mode={mode} needs trainer.use_v1=true (the legacy trainer ignores it)"
            raise RecipeConfigError("trainer.use_v1", message)
        return None
    from verl.trainer.ppo.v1 import get_trainer_cls

    try:
        trainer_cls = get_trainer_cls(mode)
    except ValueError as error:
        raise RecipeConfigError("trainer.v1.trainer_mode", f"trainer.v1.trainer_mode={mode}: {error}") from error
    if mode not in plugin_modes():  # ours: their own section, PipelineConfig and layout checks
        return None
    from verl_pipe.trainers.config import PipelineConfig, PipelineConfigError

    try:
        # The trainer's own checks without its constructor (which starts workers). Ray is not running, so its
        # cluster-size check is skipped; check_layout's cluster_gpus check stands in for it.
        trainer = trainer_cls.__new__(trainer_cls)
        trainer.pipeline_cfg = PipelineConfig.from_section(mode, _get(config, f"trainer.v1.{mode}") or {})
        trainer._check_layout(config)
        return int(trainer.parameter_sync_step_for(config))
    except PipelineConfigError as error:
        match = _KEY_IN_TEXT.search(str(error))
        raise RecipeConfigError(match.group(1) if match else f"trainer.v1.{mode}", str(error)) from error


def check_rollout_composition(config):
    """The replica, server, checkpoint engine and client the run builds (:func:`verl_pipe.rollout.composition.compose`,
    the trainer's own decision); a combination that would fail once the workers are up stops the dry run here."""
    from verl_pipe.rollout.composition import RolloutCompositionError, compose

    try:
        return compose(config)
    except RolloutCompositionError as error:
        raise RecipeConfigError(error.key, str(error)) from error


def check_reward(config) -> str:
    """The reward function and manager the reward workers will load exist (they fail only after the first batch)."""
    path = _get(config, "reward.custom_reward_function.path", Optional[str])
    name = _get(config, "reward.custom_reward_function.name", Optional[str])
    if path:
        from verl.utils.import_utils import load_module

        key = "reward.custom_reward_function.path"
        try:
            module = load_module(path)
        except Exception as error:  # ImportError, FileNotFoundError, or the module's own import-time failure
            raise RecipeConfigError(key, f"{key}={path} cannot be loaded: {error}") from error
        if not callable(getattr(module, name or "", None)):
            key = "reward.custom_reward_function.name"
            raise RecipeConfigError(key, f"{key}={name}: {path} has no function of that name")
    manager = _get(config, "reward.reward_manager.name", str)
    if _get(config, "reward.reward_manager.source", str, "register") == "register":
        from verl.experimental.reward_loop.reward_manager import get_reward_manager_cls

        try:
            get_reward_manager_cls(manager)
        except ValueError as error:
            key = "reward.reward_manager.name"
            raise RecipeConfigError(key, f"{key}={manager}: {error}") from error
    return f"reward function {path or 'verl default'}:{name} and reward manager {manager} found"


def run_verl_validate_config(config) -> None:
    """verl's own start-up validation, called as ``verl.trainer.main_ppo.main`` calls it."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    try:
        validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    except Exception as error:  # verl raises AssertionError/ValueError/TypeError with the key in the text
        match = _KEY_IN_TEXT.search(str(error))
        raise RecipeConfigError(match.group(1) if match else "config", f"verl's validate_config: {error}") from error


def validate(config, ctx: RecipeContext) -> RecipeSummary:
    """Run every check (see the module docstring) and return the summary. Raises :class:`RecipeConfigError`."""
    from verl_pipe.compat import SetupError, check_verl_version

    try:
        check_verl_version()
    except SetupError as error:
        raise RecipeConfigError("verl", str(error)) from error
    checks = ["hydra composed verl's ppo_trainer.yaml"]
    _build(config, "actor_rollout_ref.actor")
    _build(config, "actor_rollout_ref.rollout")
    # (verl reads algorithm.* as a DictConfig, not as AlgoConfig, which would refuse GRPO+'s own keys.)
    checks.append("verl dataclasses built: ActorConfig (with GRPO+'s checks) and RolloutConfig")
    run_verl_validate_config(config)
    checks.append("verl's validate_config passed")
    layout = layout_of(config)
    # before the mode's own checks (which compose too): its refusal names the rollout's key, not the mode's
    composition = check_rollout_composition(config)
    sync_step = check_trainer_mode(config, layout)
    if values_use_v1 := _get(config, "trainer.use_v1", bool, True):
        checks.append(f"trainer mode {layout.trainer_mode} found in verl's trainer registry")
    else:
        checks.append("legacy trainer (trainer.use_v1=false)")
    if layout.trainer_mode in plugin_modes():
        checks.append(f"PipelineConfig and the {layout.trainer_mode} layout checks passed")
    checks.append(f"rollout classes resolved for platform {composition.platform}: the replica, server and checkpoint "
                  "engine it builds can run this mode")  # fmt: skip
    checks.append(check_reward(config))
    warnings = check_layout(config, layout, ctx)
    checks.append("layout: TP and SP tile their pools, one sequence fits the token budget, pools fit the cluster")

    hints = typing.get_type_hints(RecipeSummary)
    values = {f.name: _get(config, f.metadata["key"], hints[f.name]) for f in fields(RecipeSummary) if f.metadata}
    stages = list(ctx.stage_lengths) or [values["max_response_length"]]
    if not 1 <= ctx.stage <= len(stages):
        raise RecipeConfigError("STAGE", f"STAGE={ctx.stage} does not exist: the recipe has stages 1..{len(stages)}")
    if stages[ctx.stage - 1] != values["max_response_length"]:
        warnings.append(
            f"data.max_response_length={values['max_response_length']} differs from stage {ctx.stage}'s "
            f"{stages[ctx.stage - 1]} (overridden on the command line?)"
        )
    if ctx.check_paths:
        model = values["model"]
        if model.startswith(("/", ".", "~")) and not os.path.isdir(os.path.expanduser(model)):
            warnings.append(f"actor_rollout_ref.model.path={model} does not exist on this machine")
        for key in ("train_files", "val_files"):
            for path in values[key] if isinstance(values[key], list) else [values[key]]:
                if not os.path.exists(os.path.expanduser(str(path))):
                    warnings.append(f"data.{key}: {path} does not exist on this machine")
    return RecipeSummary(
        recipe=ctx.recipe,
        stage=ctx.stage,
        stages=stages,
        **values,
        trainer_mode=layout.trainer_mode if values_use_v1 else "legacy",
        parameter_sync_step=sync_step,
        layout=layout.to_dict(),
        rollout_classes=composition.to_dict(),
        cluster_gpus=ctx.cluster_gpus,
        checks=checks,
        warnings=warnings,
    )


def dry_run(overrides: list[str], ctx: RecipeContext) -> RecipeSummary:
    """Compose first (cheap: catches most typos before verl and torch are imported), then validate."""
    return validate(compose_config(overrides), ctx)


def quickstart_overrides(model: str, steps: int, ranks: int, extra: list[str], mode: str = "sync") -> list[str]:
    """The list ``verl-pipe quickstart`` hands verl, with the paths of the model and data it would build first."""
    from verl_pipe.compat import SetupError
    from verl_pipe.quickstart import QuickstartConfig, training_overrides

    cfg = QuickstartConfig(model=model, steps=steps, ranks=ranks, mode=mode, overrides=list(extra))
    try:
        cfg.validate()
    except SetupError as error:
        raise RecipeConfigError("quickstart", str(error)) from error
    cache = os.environ.get("VERL_PIPE_CACHE") or os.path.expanduser("~/.cache/verl_pipe")
    model_path = os.path.join(cache, "models", model) if model in ("smollm2", "tiny") else model
    run_dir = os.path.abspath("runs/quickstart-dry-run")
    data = os.path.join(run_dir, "data")
    return training_overrides(cfg, model_path, f"{data}/train.parquet", f"{data}/val.parquet", run_dir)


# --- output and command line ------------------------------------------------------------------------------------


def format_summary(s: RecipeSummary) -> str:
    layout = GpuLayout(**{k: s.layout[k] for k in GpuLayout.__dataclass_fields__})
    plan = " -> ".join(f"{n // 1024}K" if n % 1024 == 0 else str(n) for n in s.stages)
    on_off = {True: "on", False: "off"}
    kl = f"KL loss {on_off[s.use_kl_loss]} (coef {s.kl_loss_coef:g}), KL in reward {on_off[s.use_kl_in_reward]}"
    mode = s.trainer_mode
    if not layout.hybrid_engine:
        mode += f" (separate pools, weight sync {s.weight_sync}, parameter_sync_step {s.parameter_sync_step})"
    batching = f"dynamic, {s.ppo_max_token_len_per_gpu} tokens/GPU" if s.use_dynamic_bsz else "fixed micro-batches"
    reward = f"{s.reward_path}:{s.reward_name}" if s.reward_path else "verl's default_compute_score"
    unit = "CPU ranks" if s.device == "cpu" else "GPUs"
    rows = [
        ("stage", f"{s.stage} of {len(s.stages)} (response lengths {plan})"),
        ("model", s.model),
        ("data", f"train {s.train_files} | val {s.val_files}"),
        ("lengths", f"prompt {s.max_prompt_length}, response {s.max_response_length}"),
        ("sampling", f"{s.rollout_name}, n={s.n}, temperature {s.temperature:g}; "
                     f"validation n={s.val_n} at {s.val_temperature:g}"),
        ("optimizer", f"lr {s.lr:g}, grad clip {s.grad_clip:g}, ppo_epochs {s.ppo_epochs}"),
        ("algorithm", f"{s.adv_estimator} advantage, {s.loss_mode} loss ({s.loss_agg_mode}), "
                      f"clip {s.clip_ratio_low:g}/{s.clip_ratio_high:g}, entropy coeff {s.entropy_coeff:g}, {kl}, "
                      f"overlong filter {s.overlong_filter or 'none'}"),
        ("batches", f"train_batch_size {s.train_batch_size} prompts ({s.train_batch_size * s.n} samples), "
                    f"ppo_mini_batch_size {s.ppo_mini_batch_size}, {batching}"),
        ("trainer mode", mode),
        ("layout", layout.describe(unit) + (f" of {s.cluster_gpus} in the cluster" if s.cluster_gpus else "")),
        *_rollout_rows(s.rollout_classes),
        ("reward", f"{reward}, manager {s.reward_manager}"),
        ("checkpoints", f"{s.checkpoint_dir} every {s.save_freq} steps ({', '.join(s.save_contents)}); "
                        f"validation every {s.test_freq} steps; {s.total_epochs} epochs"),
    ]  # fmt: skip
    width = max(len(name) for name, _ in rows)
    lines = [f"verl-pipe recipe dry run: {s.recipe}"]
    lines += [f"  {name.ljust(width)}  {value}" for name, value in rows]
    lines += [f"  ok: {check}" for check in s.checks]
    lines += [f"  warning: {warning}" for warning in s.warnings]
    return "\n".join(lines)


def _rollout_rows(classes: dict[str, Any]) -> list[tuple[str, str]]:
    if not classes:
        return []
    from verl_pipe.rollout.composition import RolloutComposition

    composition = RolloutComposition(**classes)
    rows = [(f"{what} ({composition.platform})" if what == "replica" else what, name)
            for what, name in composition.describe()]  # fmt: skip
    return rows


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m verl_pipe.recipe_check", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    dry = sub.add_parser("dry-run", help="compose and validate a recipe's overrides against verl's config, no GPU")
    dry.add_argument("--json", action="store_true", help="print the summary as one JSON object on stdout")
    dry.add_argument("--verbose", action="store_true", help="also show what verl printed and logged (on stderr)")
    dry.add_argument("--recipe", default="custom")
    dry.add_argument("--stage", type=int, default=1)
    dry.add_argument("--stages", default="", help="response length of every stage, comma separated")
    dry.add_argument("--cluster-gpus", dest="cluster_gpus", type=int, help="NNODES x GPUS_PER_NODE")
    dry.add_argument("overrides", nargs="*", help="hydra overrides, after --")
    quick = sub.add_parser("dry-run-quickstart", help="the same for `verl-pipe quickstart` (recipes/quickstart_cpu.sh)")
    quick.add_argument("--json", action="store_true")
    quick.add_argument("--verbose", action="store_true")
    quick.add_argument("--model", default="smollm2")
    quick.add_argument("--steps", type=int, default=3)
    quick.add_argument("--ranks", type=int, default=1)
    quick.add_argument("--mode", default="sync", help="the quickstart's --mode")
    quick.add_argument("overrides", nargs="*")
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "dry-run-quickstart":
        ctx = RecipeContext(recipe="quickstart_cpu", check_paths=False)  # quickstart builds model and data first
    else:
        ctx = RecipeContext(
            recipe=args.recipe,
            stage=args.stage,
            stage_lengths=tuple(int(x) for x in args.stages.split(",") if x.strip()),
            cluster_gpus=args.cluster_gpus,
        )
    # verl and the plugin print, log and warn while importing and validating (without a GPU they also warn that
    # none was found, which is expected here): hold that back unless asked, and keep stdout for the summary.
    captured = io.StringIO()
    try:
        with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
            overrides = args.overrides
            if args.command == "dry-run-quickstart":
                overrides = quickstart_overrides(args.model, args.steps, args.ranks, args.overrides, args.mode)
            summary = dry_run(overrides, ctx)
    except RecipeConfigError as error:
        print(captured.getvalue() if args.verbose else "", end="", file=sys.stderr)
        where = f"{ctx.recipe} stage {ctx.stage}" if len(ctx.stage_lengths) > 1 else ctx.recipe
        print(f"verl-pipe recipes: dry run of {where} failed at {error.key}: {error}", file=sys.stderr)
        return 2
    print(captured.getvalue() if args.verbose else "", end="", file=sys.stderr)
    print(json.dumps(asdict(summary), indent=2) if args.json else format_summary(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
