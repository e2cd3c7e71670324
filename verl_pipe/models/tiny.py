"""A tiny random-init Qwen2 model with a locally trained byte-level BPE tokenizer.

It exists so that tests and CPU smoke runs exercise the real verl code paths (HF folder on disk,
``AutoTokenizer``/``AutoModelForCausalLM``, ChatML chat template, ``model_type == "qwen2"`` so verl picks
its Qwen continuous-token builder) without network access or downloaded weights. Builds in about a second.

Heavy libraries (torch, transformers, tokenizers) are imported inside the functions so that importing
:mod:`verl_pipe.models` stays cheap.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

__all__ = ["build_tiny_qwen2", "cache_root", "build_atomically", "COMPLETE_MARKER", "CHATML_TEMPLATE"]

COMPLETE_MARKER = ".complete"
# Bump when the build recipe changes in a way the hashed inputs below do not capture.
_BUILD_VERSION = 2

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [PAD_TOKEN, IM_START, IM_END]  # ids 0, 1, 2

# Qwen2.5-style ChatML without the default system prompt (shorter prompts for a tiny context). Tool schemas,
# assistant tool calls and ``tool`` messages render the way Qwen2.5 renders them, so verl's multi-turn /
# tool agent loops work unchanged; list-of-parts content is accepted because verl retries with it.
CHATML_TEMPLATE = (
    "{%- macro content(c) -%}"
    "{%- if c is string -%}{{- c -}}"
    "{%- elif c -%}{%- for p in c -%}{%- if p.type == 'text' -%}{{- p.text -}}{%- endif -%}{%- endfor -%}"
    "{%- endif -%}"
    "{%- endmacro -%}"
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if messages and messages[0].role == 'system' -%}{{- content(messages[0].content) + '\\n\\n' -}}{%- endif -%}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\\n</tool_call><|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'system' -%}"
    "{%- if not (tools and loop.first) -%}"
    "{{- '<|im_start|>system\\n' + content(message.content) + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- elif message.role == 'tool' -%}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + content(message.content) + '\\n</tool_response><|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + content(message.content) -}}"
    "{%- for tc in (message.tool_calls or []) -%}"
    "{%- set f = tc.function if tc.function is defined else tc -%}"
    "{%- if content(message.content) or not loop.first -%}{{- '\\n' -}}{%- endif -%}"
    '{{- \'<tool_call>\\n{"name": "\' + f.name + \'", "arguments": \' -}}'
    "{%- if f.arguments is string -%}{{- f.arguments -}}{%- else -%}{{- f.arguments | tojson -}}{%- endif -%}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

# Small built-in corpus: English prose, Python code and chat turns, so merges cover the text the tiny model
# will see in tests (prompts, code answers). Byte-level BPE round-trips anything, even text not seen here.
_ENGLISH = """\
The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step.
Reinforcement learning trains a policy to maximize the expected reward. The policy generates a response,
a reward function scores it, and the advantage tells the optimizer which responses were better than the
average of their group. In group relative policy optimization, several responses are sampled for each
prompt and their rewards are normalized within the group. The reference model keeps the policy close to
where it started, and the KL penalty measures how far it has moved.
Write a function that returns the sum of two numbers. Read the input from standard input and print the
answer to standard output. The first line contains an integer n, the number of test cases. Each of the
next n lines contains two integers a and b separated by a space. For each test case, print a single line.
Language models read text as tokens. A tokenizer splits the text into pieces, and each piece has an id.
Byte-level tokenizers never fail on unknown characters, because every byte has its own token.
It was a bright cold day in April, and the clocks were striking thirteen. She opened the window, looked
at the garden, and decided that the weather was good enough for a long walk along the river.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 12 16 32 64 100 128 256 512 1000 1024 2048 4096 3.14 2.71 -1 1e-5.
"""

_PYTHON = '''\
import sys
from typing import List


def add(a: int, b: int) -> int:
    """Return the sum of a and b."""
    return a + b


def main() -> None:
    data = sys.stdin.read().split()
    n = int(data[0])
    values: List[int] = [int(x) for x in data[1 : n + 1]]
    total = 0
    for value in values:
        if value % 2 == 0:
            total += value
        else:
            total -= value
    print(total)


class Stack:
    def __init__(self) -> None:
        self.items = []

    def push(self, item) -> None:
        self.items.append(item)

    def pop(self):
        if not self.items:
            raise IndexError("pop from empty stack")
        return self.items.pop()

    def __len__(self) -> int:
        return len(self.items)


def fibonacci(n: int) -> int:
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


def is_prime(n: int) -> bool:
    if n < 2:
        return False
    i = 2
    while i * i <= n:
        if n % i == 0:
            return False
        i += 1
    return True


if __name__ == "__main__":
    main()
'''

_CHAT = [
    (
        "You are a helpful assistant.",
        "Write a Python program that reads two integers and prints their sum.",
        "Here is a program:\n```python\na, b = map(int, input().split())\nprint(a + b)\n```",
    ),
    ("You are a helpful assistant.", "What is the capital of France?", "The capital of France is Paris."),
    ("You are a careful coding assistant.", "Fix the bug: def f(x): return x +", "def f(x):\n    return x + 1"),
    ("You are a helpful assistant.", "Solve 12 * 7.", "12 * 7 = 84. The answer is \\boxed{84}."),
    ("You are a helpful assistant.", "Say hello in three languages.", "Hello! Bonjour! Hola!"),
]


def _corpus() -> list[str]:
    # Chat turns are rendered without the special markers: those are added tokens and are never merged.
    chats = [f"system\n{s}\nuser\n{u}\nassistant\n{a}\n" for s, u, a in _CHAT]
    return [_ENGLISH, _PYTHON, *chats] * 2


def cache_root() -> Path:
    """Root of verl-pipe's on-disk cache: ``$VERL_PIPE_CACHE`` or ``~/.cache/verl_pipe``."""
    return Path(os.environ.get("VERL_PIPE_CACHE") or Path.home() / ".cache" / "verl_pipe").expanduser()


def build_atomically(out_dir: str | os.PathLike[str], build: Callable[[str], None], *, force: bool = False) -> str:
    """Run ``build(tmp_dir)`` and publish ``tmp_dir`` as ``out_dir`` with one rename.

    Readers only trust folders carrying :data:`COMPLETE_MARKER`, and the marker is written before the rename,
    so an interrupted build leaves at most a hidden temp folder, and concurrent builders never see half a
    model: the first one to publish wins and later ones discard their identical copy.
    """
    out = Path(out_dir).expanduser().absolute()
    if not force and (out / COMPLETE_MARKER).is_file():
        return str(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent)
    try:
        build(tmp)
        (Path(tmp) / COMPLETE_MARKER).write_text("ok\n")
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700; a published cache folder should be readable like any other
        if not force and (out / COMPLETE_MARKER).is_file():
            return str(out)  # another process published first
        if out.exists():
            # rename() cannot replace a non-empty folder: move the old one aside (force, or a stray folder
            # without marker), then delete it after publishing.
            stale = tempfile.mkdtemp(prefix=f".{out.name}.stale-", dir=out.parent)
            os.replace(out, stale)
            shutil.rmtree(stale, ignore_errors=True)
        try:
            os.replace(tmp, out)
        except OSError:
            if not (out / COMPLETE_MARKER).is_file():  # lost a race to a complete folder: that is fine
                raise
        return str(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # no-op once renamed


def _train_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    # Exactly Qwen2's pipeline (NFC, Qwen split regex, byte-level): transformers 5 ignores the tokenizer.json
    # pipeline for model_type "qwen2" and rebuilds it from vocab+merges in Qwen2Tokenizer, so training with
    # anything else would make AutoTokenizer (verl, vLLM, SGLang) encode differently from tokenizer.json.
    # Byte-level means every string encodes; NFC means decode(encode(t)) == unicodedata.normalize("NFC", t).
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes, even ones absent from the corpus
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        chat_template=CHATML_TEMPLATE,
        clean_up_tokenization_spaces=False,  # would strip spaces before punctuation: breaks round-trips
        model_max_length=2048,
    )


def _build(out_dir: str, *, seed: int, num_layers: int, hidden_size: int, vocab_size: int) -> None:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    tokenizer = _train_tokenizer(vocab_size)
    pad_id, eos_id = tokenizer.convert_tokens_to_ids([PAD_TOKEN, IM_END])
    config = Qwen2Config(
        vocab_size=-(-len(tokenizer) // 64) * 64,  # round up: friendlier shapes for kernels / TP sharding
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        dtype="float32",
        bos_token_id=pad_id,  # like Qwen2: bos id is <|endoftext|>, the tokenizer itself adds no bos
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(bos_token_id=pad_id, eos_token_id=eos_id, pad_token_id=pad_id)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


def build_tiny_qwen2(
    out_dir: str | None = None,
    *,
    seed: int = 0,
    num_layers: int = 2,
    hidden_size: int = 64,
    vocab_size: int = 512,
    force: bool = False,
) -> str:
    """Build (once) a random-init tiny ``Qwen2ForCausalLM`` + ChatML tokenizer folder and return its path.

    The default folder is ``$VERL_PIPE_CACHE/models/tiny-qwen2-<hash>``, where the hash covers the arguments
    and the recipe (corpus, template), so a changed recipe never reuses a stale folder.
    """
    if hidden_size % 4 or (hidden_size // 4) % 2:
        raise ValueError(f"hidden_size must be a multiple of 8 (4 heads with even head_dim), got {hidden_size}")
    if out_dir is None:
        key = json.dumps(
            [_BUILD_VERSION, seed, num_layers, hidden_size, vocab_size, CHATML_TEMPLATE, _corpus()], sort_keys=True
        )
        digest = hashlib.sha256(key.encode()).hexdigest()[:12]
        out_dir = str(cache_root() / "models" / f"tiny-qwen2-{digest}")
    return build_atomically(
        out_dir,
        lambda tmp: _build(tmp, seed=seed, num_layers=num_layers, hidden_size=hidden_size, vocab_size=vocab_size),
        force=force,
    )
