"""verl-pipe: pipelined RL post-training for verl, with GRPO+, a code sandbox and a CPU backend.

Importing this package is cheap: nothing from verl, torch or Ray is imported here. Registration with verl
happens in :mod:`verl_pipe.register`, which verl loads through the ``verl.plugins`` entry point.
"""

__version__ = "0.1.0"

SUPPORTED_VERL = ">=0.9.1,<0.10"
