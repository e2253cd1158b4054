"""Stand-in for SGLang (nanscope repro --slime-src): a --debug-train-only run starts no SGLang engine.

slime imports sglang at module level (train.py:6, ray/rollout.py:8, sglang_utils/arguments.py:3,
megatron_to_hf/qwen3moe.py:4); it reads `__version__` (arguments.py validate_args, the converters).
"""

__version__ = "0.4.10+nanscope.standin"
STANDIN = True
