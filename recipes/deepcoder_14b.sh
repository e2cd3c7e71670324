#!/usr/bin/env bash
# DeepCoder-14B: GRPO+ on DeepSeek-R1-Distill-Qwen-14B with iterative context lengthening, 16K then 32K.
# Hyperparameters and their sources: docs/recipes.md. Needs verl[vllm] and verl-pipe on every node of a Ray cluster.
#   bash recipes/deepcoder_14b.sh                                    # stage 1: 16K responses
#   STAGE=2 STAGE1_CKPT=.../global_step_160 bash recipes/deepcoder_14b.sh   # stage 2: 32K, from stage 1
#   TRAINER_MODE=sync bash recipes/deepcoder_14b.sh                  # the paper's synchronous setting
#   DRY_RUN=1 bash recipes/deepcoder_14b.sh                          # compose + validate + print, no GPU (DRY_RUN=json)
#   bash recipes/deepcoder_14b.sh trainer.total_training_steps=5     # any hydra override goes last
set -euo pipefail

RECIPE=deepcoder_14b
STAGE=${STAGE:-1}                                  # 1: 16K responses, 2: 32K from the stage-1 checkpoint
STAGE1_CKPT=${STAGE1_CKPT:-}                       # stage 2 only: stage 1's .../global_step_N (or its HF folder)
MODEL_PATH=${MODEL_PATH:-deepseek-ai/DeepSeek-R1-Distill-Qwen-14B}   # stage 1's starting model
DATA_DIR=${DATA_DIR:-$HOME/data/deepcoder}
TRAIN_FILES=${TRAIN_FILES:-$DATA_DIR/deepcoder_train.parquet}        # TACO-verified + PrimeIntellect + LCB
VAL_FILES=${VAL_FILES:-$DATA_DIR/test_livecodebench.parquet}
CKPT_DIR=${CKPT_DIR:-$HOME/checkpoints}
NNODES=${NNODES:-4}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
TRAINER_MODE=${TRAINER_MODE:-one_off_pipeline}     # one_off_pipeline | minibatch_pipeline | in_flight_pipeline | sync
TRAINER_GPUS=${TRAINER_GPUS:-}                     # pipelined modes: trainer pool size; default half (16 of 32)
PROJECT=${PROJECT:-deepcoder}
LOGGER=${LOGGER:-[console,wandb]}

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=recipes/common.sh
source "$HERE/common.sh"

STAGE_LENGTHS=16384,32768
case "$STAGE" in
    1)
        MODEL=$MODEL_PATH RESPONSE_LENGTH=16384
        TRAIN_BATCH=32 MINI_BATCH=16 MAX_TOKENS_PER_GPU=20000 VAL_BEFORE_TRAIN=true
        ;;
    2)
        MODEL=$(recipe_stage_model STAGE1_CKPT "$STAGE1_CKPT")
        RESPONSE_LENGTH=32768
        TRAIN_BATCH=128 MINI_BATCH=64 MAX_TOKENS_PER_GPU=24000 VAL_BEFORE_TRAIN=false
        ;;
    *) recipe_die "STAGE=$STAGE: use 1 (16K) or 2 (32K)" ;;
esac
EXPERIMENT=${EXPERIMENT:-deepcoder-14b-$((RESPONSE_LENGTH / 1024))k-$TRAINER_MODE}
recipe_layout

PRESETS=(
    'hydra.searchpath=[pkg://verl_pipe.config]'
    +verl_pipe=grpo_plus                                  # GRPO+ advantage and loss, overlong masking, IS mask
)
MODEL_ARGS=(
    actor_rollout_ref.model.path="$MODEL"
    actor_rollout_ref.model.use_remove_padding=true
    actor_rollout_ref.model.enable_gradient_checkpointing=true
)
DATA_ARGS=(
    data.train_files="$TRAIN_FILES"
    data.val_files="$VAL_FILES"
    data.max_prompt_length=2048
    data.max_response_length="$RESPONSE_LENGTH"
    data.train_batch_size="$TRAIN_BATCH"
    data.filter_overlong_prompts=true                      # verl's default truncation=error would stop the run
)
ALGO_ARGS=(                                                # the paper's GRPO+ values, stated here as the recipe's own
    actor_rollout_ref.actor.clip_ratio_low=0.2
    actor_rollout_ref.actor.clip_ratio_high=0.28
    actor_rollout_ref.actor.entropy_coeff=0
    actor_rollout_ref.actor.use_kl_loss=false
    actor_rollout_ref.actor.kl_loss_coef=0
    algorithm.use_kl_in_reward=false
    actor_rollout_ref.actor.policy_loss.overlong_filter=all
)
OPTIM_ARGS=(
    actor_rollout_ref.actor.optim.lr=1e-6
    actor_rollout_ref.actor.grad_clip=1.0
    actor_rollout_ref.actor.ppo_epochs=1
    actor_rollout_ref.actor.ppo_mini_batch_size="$MINI_BATCH"
    actor_rollout_ref.actor.use_dynamic_bsz=true
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu="$MAX_TOKENS_PER_GPU"   # x SP 2 >= prompt + response
    actor_rollout_ref.actor.ulysses_sequence_parallel_size=2
)
ROLLOUT_ARGS=(
    actor_rollout_ref.rollout.name=vllm
    actor_rollout_ref.rollout.tensor_model_parallel_size=2
    actor_rollout_ref.rollout.gpu_memory_utilization=0.8
    actor_rollout_ref.rollout.n=8
    actor_rollout_ref.rollout.temperature=0.6
    actor_rollout_ref.rollout.val_kwargs.n=2
    actor_rollout_ref.rollout.val_kwargs.temperature=0.6
    actor_rollout_ref.rollout.val_kwargs.do_sample=true
)
REWARD_ARGS=(                                              # sandboxed, binary, 15 longest tests (docs/reward.md)
    reward.custom_reward_function.path=pkg://verl_pipe.reward_score
    reward.custom_reward_function.name=compute_score
    reward.reward_manager.name=interleaved                 # score each sample as it finishes generating
)
TRAINER_ARGS=(
    trainer.project_name="$PROJECT"
    trainer.experiment_name="$EXPERIMENT"
    trainer.logger="$LOGGER"
    trainer.default_local_dir="$CKPT_DIR/$PROJECT/$EXPERIMENT"
    trainer.total_epochs=100
    trainer.save_freq=10
    trainer.test_freq=10
    trainer.val_before_train="$VAL_BEFORE_TRAIN"
    actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]   # stage 2 starts from hf_model
)
OVERRIDES=("${PRESETS[@]}" "${MODEL_ARGS[@]}" "${DATA_ARGS[@]}" "${ALGO_ARGS[@]}" "${OPTIM_ARGS[@]}"
    "${ROLLOUT_ARGS[@]}" "${REWARD_ARGS[@]}" "${TRAINER_ARGS[@]}" "${LAYOUT_ARGS[@]}")

recipe_launch "$@"
