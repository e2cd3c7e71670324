# Shared by the GPU recipes (sourced, not run): the Python to run, input checks, the GPU layout per trainer mode,
# stage checkpoints, and the launch (quickstart_cpu.sh sources it for the Python only). Each recipe sets its defaults first, builds its override arrays, then calls recipe_launch.
# shellcheck shell=bash

# The project folder (this file is in its recipes/).
RECIPE_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# The Python the recipes run: $PYTHON when set; else the activated virtualenv's (python3 on PATH); else the
# project's own .venv that `make install` builds, so a recipe works straight after it without activating it;
# else python3 on PATH.
recipe_python() {
    if [[ -n "${PYTHON:-}" ]]; then
        echo "$PYTHON"
    elif [[ -z "${VIRTUAL_ENV:-}" && -x "$RECIPE_REPO/.venv/bin/python" ]]; then
        echo "$RECIPE_REPO/.venv/bin/python"
    else
        echo python3
    fi
}

recipe_require_python() {  # PYTHON: it must see verl, hydra and verl-pipe, or stop naming the fix
    command -v "$1" >/dev/null || recipe_die "$1 is not a Python found on this machine: set PYTHON=/path/to/python"
    local missing
    missing=$("$1" -c 'import importlib.util as u
print(", ".join(name for name in ("verl", "hydra", "verl_pipe") if u.find_spec(name) is None))') ||
        recipe_die "$1 does not run: set PYTHON to the Python that has verl and verl-pipe"
    [[ -z "$missing" ]] || recipe_die "$1 cannot import $missing: run \`make install\` (the recipes then use" \
        "$RECIPE_REPO/.venv by themselves), activate the environment that has them, or set PYTHON=/path/to/python"
}

recipe_die() {
    echo "${RECIPE:-recipe}: $*" >&2
    exit 2
}

recipe_require_int() {  # NAME VALUE: a positive whole number, or stop naming the variable
    [[ "$2" =~ ^[1-9][0-9]*$ ]] || recipe_die "$1=$2 must be a positive whole number"
}

# Fills LAYOUT_ARGS from TRAINER_MODE, NNODES, GPUS_PER_NODE and TRAINER_GPUS.
#   sync: verl V1's synchronous trainer with the hybrid engine; every GPU trains and samples in turn.
#   one_off_pipeline / minibatch_pipeline / in_flight_pipeline: TRAINER_GPUS train, the rest sample. The split
#   takes whole nodes when TRAINER_GPUS is a multiple of GPUS_PER_NODE (cross-node FSDP traffic stays within the
#   trainer nodes), else the same share of every node (as the original verl-pipe's n_training_gpus_per_node did).
recipe_layout() {
    recipe_require_int NNODES "$NNODES"
    recipe_require_int GPUS_PER_NODE "$GPUS_PER_NODE"
    local total=$((NNODES * GPUS_PER_NODE))
    case "$TRAINER_MODE" in
        sync)
            LAYOUT_ARGS=(
                trainer.use_v1=true
                trainer.v1.trainer_mode=sync
                actor_rollout_ref.hybrid_engine=true
                trainer.nnodes="$NNODES"
                trainer.n_gpus_per_node="$GPUS_PER_NODE"
            )
            ;;
        one_off_pipeline | minibatch_pipeline | in_flight_pipeline)
            TRAINER_GPUS=${TRAINER_GPUS:-$((total / 2))}
            recipe_require_int TRAINER_GPUS "$TRAINER_GPUS"
            ((TRAINER_GPUS < total)) ||
                recipe_die "TRAINER_GPUS=$TRAINER_GPUS leaves no sampler GPU of NNODES x GPUS_PER_NODE = $total"
            local t_nodes t_gpn s_nodes s_gpn
            if ((TRAINER_GPUS % GPUS_PER_NODE == 0)); then
                t_nodes=$((TRAINER_GPUS / GPUS_PER_NODE)) t_gpn=$GPUS_PER_NODE
                s_nodes=$((NNODES - t_nodes)) s_gpn=$GPUS_PER_NODE
            elif ((TRAINER_GPUS % NNODES == 0)); then
                t_nodes=$NNODES t_gpn=$((TRAINER_GPUS / NNODES))
                s_nodes=$NNODES s_gpn=$((GPUS_PER_NODE - t_gpn))
            else
                recipe_die "TRAINER_GPUS=$TRAINER_GPUS must be whole nodes (a multiple of" \
                    "GPUS_PER_NODE=$GPUS_PER_NODE) or the same share of every node (a multiple of NNODES=$NNODES)"
            fi
            LAYOUT_ARGS=(
                "+verl_pipe_trainer=$TRAINER_MODE"  # V1 mode, hybrid_engine=false, nccl weight sync
                trainer.nnodes="$t_nodes"
                trainer.n_gpus_per_node="$t_gpn"
                actor_rollout_ref.rollout.nnodes="$s_nodes"
                actor_rollout_ref.rollout.n_gpus_per_node="$s_gpn"
            )
            ;;
        *) recipe_die "TRAINER_MODE=$TRAINER_MODE: use one_off_pipeline (default), minibatch_pipeline," \
            "in_flight_pipeline or sync" ;;
    esac
}

# Prints the HF model folder a later stage starts from. Accepts the HF folder itself or a verl checkpoint step
# (.../global_step_N), whose actor/huggingface folder the previous stage wrote (save_contents has hf_model).
recipe_stage_model() {  # VAR_NAME VALUE
    local name=$1 path=$2
    [[ -n "$path" ]] || recipe_die "STAGE=$STAGE starts from the previous stage's checkpoint: set $name to its" \
        ".../global_step_N folder (or that step's actor/huggingface folder)"
    path=${path%/}
    if [[ -d "$path/actor/huggingface" ]]; then
        echo "$path/actor/huggingface"
    elif [[ -f "$path/config.json" ]]; then
        echo "$path"
    elif [[ "${DRY_RUN:-0}" != 0 ]]; then
        echo "${RECIPE}: note: $name=$path is not a checkpoint on this machine (fine for a dry run)" >&2
        if [[ "$(basename "$path")" == global_step_* ]]; then echo "$path/actor/huggingface"; else echo "$path"; fi
    else
        recipe_die "$name=$path is neither a verl checkpoint step with actor/huggingface nor an HF model folder"
    fi
}

# Runs verl's stock entrypoint with OVERRIDES plus the script's arguments, or with DRY_RUN=1 composes and
# validates the same list (DRY_RUN=json: as JSON) without a GPU or Ray.
recipe_launch() {
    local python
    python=$(recipe_python)
    recipe_require_python "$python"
    if [[ "${DRY_RUN:-0}" != 0 ]]; then
        local json=()
        [[ "$DRY_RUN" == json ]] && json=(--json)
        exec "$python" -m verl_pipe.recipe_check dry-run "${json[@]}" --recipe "$RECIPE" --stage "$STAGE" \
            --stages "$STAGE_LENGTHS" --cluster-gpus "$((NNODES * GPUS_PER_NODE))" -- "${OVERRIDES[@]}" "$@"
    fi
    # Every code sample is its own sandboxed process tree, and vLLM opens many sockets.
    ulimit -n 1048576 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
    exec "$python" -m verl.trainer.main_ppo "${OVERRIDES[@]}" "$@"
}
