#!/usr/bin/env bash
# DeepScaleR-1.5B: math RL on DeepSeek-R1-Distill-Qwen-1.5B with iterative context lengthening, 8K -> 16K -> 24K.
# Stage 1 runs on one node, stages 2 and 3 on four. Hyperparameters and their sources: docs/recipes.md.
#   bash recipes/deepscaler_1.5b.sh                                           # stage 1: 8K, 1 x 8 GPUs
#   STAGE=2 STAGE1_CKPT=.../global_step_N bash recipes/deepscaler_1.5b.sh     # stage 2: 16K, 4 x 8 GPUs
#   STAGE=3 STAGE2_CKPT=.../global_step_N bash recipes/deepscaler_1.5b.sh     # stage 3: 24K, 4 x 8 GPUs
#   ALGO=grpo bash recipes/deepscaler_1.5b.sh        # DeepScaleR's own loss: GRPO + KL loss 0.001 + entropy 0.001
#   TRAINER_MODE=sync DRY_RUN=1 bash recipes/deepscaler_1.5b.sh               # compose + validate + print, no GPU
set -euo pipefail

RECIPE=deepscaler_1.5b
STAGE=${STAGE:-1}                                  # 1: 8K, 2: 16K from stage 1, 3: 24K from stage 2
STAGE1_CKPT=${STAGE1_CKPT:-}                       # stage 2 only: stage 1's .../global_step_N (or its HF folder)
STAGE2_CKPT=${STAGE2_CKPT:-}                       # stage 3 only: stage 2's .../global_step_N (or its HF folder)
MODEL_PATH=${MODEL_PATH:-deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B}  # stage 1's starting model
DATA_DIR=${DATA_DIR:-$HOME/data/deepscaler}
TRAIN_FILES=${TRAIN_FILES:-$DATA_DIR/deepscaler_train.parquet}      # DeepScaleR-Preview (AIME, AMC, Omni-MATH, STILL)
VAL_FILES=${VAL_FILES:-$DATA_DIR/aime.parquet}
CKPT_DIR=${CKPT_DIR:-$HOME/checkpoints}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
TRAINER_MODE=${TRAINER_MODE:-one_off_pipeline}     # one_off_pipeline | minibatch_pipeline | in_flight_pipeline | sync
TRAINER_GPUS=${TRAINER_GPUS:-}                     # pipelined modes: trainer pool size; default half
ALGO=${ALGO:-grpo_plus}                            # grpo_plus (verl-pipe) | grpo (DeepScaleR's original loss)
PROJECT=${PROJECT:-deepscaler}
LOGGER=${LOGGER:-[console,wandb]}

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=recipes/common.sh
source "$HERE/common.sh"

STAGE_LENGTHS=8192,16384,24576
case "$STAGE" in
    1)
        MODEL=$MODEL_PATH
        RESPONSE_LENGTH=8192 N=8 FREQ=20 DEFAULT_NODES=1
        ;;
    2)
        MODEL=$(recipe_stage_model STAGE1_CKPT "$STAGE1_CKPT")
        RESPONSE_LENGTH=16384 N=16 FREQ=10 DEFAULT_NODES=4
        ;;
    3)
        MODEL=$(recipe_stage_model STAGE2_CKPT "$STAGE2_CKPT")
        RESPONSE_LENGTH=24576 N=16 FREQ=10 DEFAULT_NODES=4
        ;;
    *) recipe_die "STAGE=$STAGE: use 1 (8K), 2 (16K) or 3 (24K)" ;;
esac
NNODES=${NNODES:-$DEFAULT_NODES}
EXPERIMENT=${EXPERIMENT:-deepscaler-1.5b-$((RESPONSE_LENGTH / 1024))k-$ALGO-$TRAINER_MODE}
recipe_layout

case "$ALGO" in
    grpo_plus)
        ALGO_ARGS=(
            'hydra.searchpath=[pkg://verl_pipe.config]'
            +verl_pipe=grpo_plus                          # GRPO+ advantage and loss, overlong masking, IS mask
            actor_rollout_ref.actor.clip_ratio_low=0.2
            actor_rollout_ref.actor.clip_ratio_high=0.28
            actor_rollout_ref.actor.entropy_coeff=0
            actor_rollout_ref.actor.use_kl_loss=false
            actor_rollout_ref.actor.kl_loss_coef=0
            algorithm.use_kl_in_reward=false
            actor_rollout_ref.actor.policy_loss.overlong_filter=all
        )
        ;;
    grpo)
        ALGO_ARGS=(
            'hydra.searchpath=[pkg://verl_pipe.config]'      # for the trainer-mode presets only
            algorithm.adv_estimator=grpo
            actor_rollout_ref.actor.clip_ratio_low=0.2
            actor_rollout_ref.actor.clip_ratio_high=0.2
            actor_rollout_ref.actor.entropy_coeff=0.001       # the verl default DeepScaleR ran with
            actor_rollout_ref.actor.use_kl_loss=true
            actor_rollout_ref.actor.kl_loss_coef=0.001
            actor_rollout_ref.actor.kl_loss_type=low_var_kl
            algorithm.use_kl_in_reward=false
            actor_rollout_ref.ref.fsdp_config.param_offload=true   # the reference model only runs forward passes
        )
        ;;
    *) recipe_die "ALGO=$ALGO: use grpo_plus (default) or grpo" ;;
esac

MODEL_ARGS=(
    actor_rollout_ref.model.path="$MODEL"
    actor_rollout_ref.model.use_remove_padding=true
    actor_rollout_ref.model.enable_gradient_checkpointing=true
)
DATA_ARGS=(
    data.train_files="$TRAIN_FILES"
    data.val_files="$VAL_FILES"
    data.max_prompt_length=1024
    data.max_response_length="$RESPONSE_LENGTH"
    data.train_batch_size=128
    data.filter_overlong_prompts=true                      # verl's default truncation=error would stop the run
)
OPTIM_ARGS=(
    actor_rollout_ref.actor.optim.lr=1e-6
    actor_rollout_ref.actor.grad_clip=1.0
    actor_rollout_ref.actor.ppo_epochs=1
    actor_rollout_ref.actor.ppo_mini_batch_size=64
    actor_rollout_ref.actor.use_dynamic_bsz=true
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=32768   # >= 1K prompt + 24K response, no SP needed
    actor_rollout_ref.actor.ulysses_sequence_parallel_size=1
)
ROLLOUT_ARGS=(
    actor_rollout_ref.rollout.name=vllm
    actor_rollout_ref.rollout.tensor_model_parallel_size=1
    actor_rollout_ref.rollout.gpu_memory_utilization=0.85
    actor_rollout_ref.rollout.n="$N"
    actor_rollout_ref.rollout.temperature=0.6
    actor_rollout_ref.rollout.val_kwargs.n="$N"
    actor_rollout_ref.rollout.val_kwargs.temperature=0.6
    actor_rollout_ref.rollout.val_kwargs.do_sample=true
)
REWARD_ARGS=(                                              # binary: last \boxed{} after </think>, sympy fallback
    reward.custom_reward_function.path=pkg://verl_pipe.reward_score
    reward.custom_reward_function.name=compute_score
    reward.reward_manager.name=interleaved
)
TRAINER_ARGS=(
    trainer.project_name="$PROJECT"
    trainer.experiment_name="$EXPERIMENT"
    trainer.logger="$LOGGER"
    trainer.default_local_dir="$CKPT_DIR/$PROJECT/$EXPERIMENT"
    trainer.total_epochs=30
    trainer.save_freq="$FREQ"
    trainer.test_freq="$FREQ"
    trainer.val_before_train=true
    actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]   # the next stage starts here
)
OVERRIDES=("${ALGO_ARGS[@]}" "${MODEL_ARGS[@]}" "${DATA_ARGS[@]}" "${OPTIM_ARGS[@]}" "${ROLLOUT_ARGS[@]}"
    "${REWARD_ARGS[@]}" "${TRAINER_ARGS[@]}" "${LAYOUT_ARGS[@]}")

recipe_launch "$@"
