"""nanscope: find, reproduce and fix NaN in Megatron-based RL runs (slime v0.1.0 GRPO), on a laptop CPU."""

__version__ = "0.1.0"
