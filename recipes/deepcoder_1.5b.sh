#!/usr/bin/env bash
# DeepCoder-1.5B: GRPO+ on DeepSeek-R1-Distill-Qwen-1.5B, one 32K stage on one node of 8 GPUs, with verl-pipe's
# one-off pipelining (the model verl-pipe itself trained). Hyperparameters and their sources: docs/recipes.md.
#   bash recipes/deepcoder_1.5b.sh                        # 4 trainer GPUs + 4 sampler GPUs
#   TRAINER_GPUS=2 bash recipes/deepcoder_1.5b.sh         # re-balance: 2 trainer + 6 sampler GPUs
#   TRAINER_MODE=sync bash recipes/deepcoder_1.5b.sh      # verl's synchronous trainer, hybrid engine
#   DRY_RUN=1 bash recipes/deepcoder_1.5b.sh              # compose + validate + print, no GPU (DRY_RUN=json)
#   bash recipes/deepcoder_1.5b.sh trainer.total_training_steps=5     # any hydra override goes last
set -euo pipefail

RECIPE=deepcoder_1.5b
STAGE=${STAGE:-1}                                  # a single stage: 32K responses
MODEL_PATH=${MODEL_PATH:-deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B}
DATA_DIR=${DATA_DIR:-$HOME/data/deepcoder}
TRAIN_FILES=${TRAIN_FILES:-$DATA_DIR/deepcoder_train.parquet}
VAL_FILES=${VAL_FILES:-$DATA_DIR/test_livecodebench.parquet}
CKPT_DIR=${CKPT_DIR:-$HOME/checkpoints}
NNODES=${NNODES:-1}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
TRAINER_MODE=${TRAINER_MODE:-one_off_pipeline}     # one_off_pipeline | minibatch_pipeline | in_flight_pipeline | sync
TRAINER_GPUS=${TRAINER_GPUS:-}                     # pipelined modes: trainer pool size; default half (4 of 8)
PROJECT=${PROJECT:-deepcoder}
LOGGER=${LOGGER:-[console,wandb]}

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=recipes/common.sh
source "$HERE/common.sh"

STAGE_LENGTHS=32768
[[ "$STAGE" == 1 ]] || recipe_die "STAGE=$STAGE: DeepCoder-1.5B has a single 32K stage (STAGE=1)"
EXPERIMENT=${EXPERIMENT:-deepcoder-1.5b-32k-$TRAINER_MODE}
recipe_layout

PRESETS=(
    'hydra.searchpath=[pkg://verl_pipe.config]'
    +verl_pipe=grpo_plus                                  # GRPO+ advantage and loss, overlong masking, IS mask
)
MODEL_ARGS=(
    actor_rollout_ref.model.path="$MODEL_PATH"
    actor_rollout_ref.model.use_remove_padding=true
    actor_rollout_ref.model.enable_gradient_checkpointing=true
)
DATA_ARGS=(
    data.train_files="$TRAIN_FILES"
    data.val_files="$VAL_FILES"
    data.max_prompt_length=2048
    data.max_response_length=32768
    data.train_batch_size=64
    data.filter_overlong_prompts=true                      # verl's default truncation=error would stop the run
)
ALGO_ARGS=(                                                # DeepCoder's GRPO+ values, as for the 14B model
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
    actor_rollout_ref.actor.ppo_mini_batch_size=16
    actor_rollout_ref.actor.use_dynamic_bsz=true
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24000   # x SP 2 >= 2K prompt + 32K response
    actor_rollout_ref.actor.ulysses_sequence_parallel_size=2
)
ROLLOUT_ARGS=(
    actor_rollout_ref.rollout.name=vllm
    actor_rollout_ref.rollout.tensor_model_parallel_size=1  # 1.5B fits one GPU: one replica per sampler GPU
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
    trainer.val_before_train=true
    actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]
)
OVERRIDES=("${PRESETS[@]}" "${MODEL_ARGS[@]}" "${DATA_ARGS[@]}" "${ALGO_ARGS[@]}" "${OPTIM_ARGS[@]}"
    "${ROLLOUT_ARGS[@]}" "${REWARD_ARGS[@]}" "${TRAINER_ARGS[@]}" "${LAYOUT_ARGS[@]}")

recipe_launch "$@"
