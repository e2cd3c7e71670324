#!/usr/bin/env bash
# GRPO+ on generated one-function coding problems (or --data embedded: the 50 shipped ones) with verl's stock
# entrypoint, on the CPU backend of verl-pipe.
# Exercises verl's real code paths on a laptop or CI box, and the greedy validation accuracy rises.
#   bash recipes/quickstart_cpu.sh                                # SmolLM2-135M-Instruct, 6 steps (as make demo)
#   MODEL=tiny STEPS=2 bash recipes/quickstart_cpu.sh trainer.use_v1=false   # any hydra override goes last
#   MODE=one_off_pipeline bash recipes/quickstart_cpu.sh           # a V1 trainer mode, as `quickstart --mode`
#   DRY_RUN=1 bash recipes/quickstart_cpu.sh                       # compose + validate + print the config only
set -euo pipefail

MODEL=${MODEL:-smollm2}            # smollm2 | tiny | path to an HF model folder
STEPS=${STEPS:-6}
RANKS=${RANKS:-1}                  # trainer ranks (gloo); in sync mode each is also one hf rollout replica
MODE=${MODE:-}                     # unset (sync) | separate_async | one_off_pipeline | minibatch_pipeline
                                   # | in_flight_pipeline
OUT_DIR=${OUT_DIR:-runs/quickstart_cpu-$(date +%Y%m%d-%H%M%S)}

export VERL_PLATFORM=cpu

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=recipes/common.sh
source "$HERE/common.sh"
RECIPE=quickstart_cpu
PYTHON=$(recipe_python)            # $PYTHON, an activated virtualenv, or the project's .venv (make install)
recipe_require_python "$PYTHON"

# DRY_RUN=1 (or json): compose and validate the run's verl config against verl's schema, then print it; builds and
# starts nothing. Arguments are then hydra overrides only (MODE sets the mode, as --mode).
if [[ "${DRY_RUN:-0}" != 0 ]]; then
    json=()
    [[ "$DRY_RUN" == json ]] && json=(--json)
    exec "$PYTHON" -m verl_pipe.recipe_check dry-run-quickstart "${json[@]}" --model "$MODEL" --steps "$STEPS" \
        --ranks "$RANKS" --mode "${MODE:-sync}" -- "$@"
fi

# The same run as `verl-pipe quickstart`: it builds the model folder and the parquet files, then launches
# `python -m verl.trainer.main_ppo` with the CPU-backend overrides, prints a line per step and draws the curves.
# MODE, when set, is --mode (the quickstart refuses a mode override or preset among the arguments, naming --mode).
mode=()
[[ -n "$MODE" ]] && mode=(--mode "$MODE")
exec "$PYTHON" -m verl_pipe.cli quickstart --model "$MODEL" --steps "$STEPS" --ranks "$RANKS" "${mode[@]}" \
    --out-dir "$OUT_DIR" "$@"
