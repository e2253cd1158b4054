"""The library versions a log prints at its start (a trainer's banner, `transformers-cli env`, a pip pin): what a
bisect over library-regression's versions starts from, said as printed, never judged.

    ==((====))==  Unsloth 2026.5.8: Fast Qwen2 patching. Transformers: 4.57.6. vLLM: 0.7.2.   transformers, vLLM
    - PyTorch version (GPU?): 2.1.0+cu121 (True)                                            torch 2.1.0+cu121
    pip install deepspeed==0.7.4                                                            DeepSpeed 0.7.4

    printed(lines) -> [Version("transformers", "4.57.6", 1), ...]   # the first of each library, in order
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# a library's name as logs print it -> as said
_NAMES = {
    "pytorch": "torch", "torch": "torch", "transformers": "transformers", "vllm": "vLLM", "deepspeed": "DeepSpeed",
    "flash-attn": "flash-attention", "flash_attn": "flash-attention", "flash-attention": "flash-attention",
    "xformers": "xformers", "triton": "triton", "trl": "TRL", "peft": "PEFT", "accelerate": "accelerate",
    "megatron-core": "megatron-core", "megatron_core": "megatron-core", "transformer-engine": "TransformerEngine",
    "transformer_engine": "TransformerEngine", "sglang": "SGLang", "cuda toolkit": "the CUDA toolkit",
}  # fmt: skip
# `Name: 1.2.3`, `name==1.2.3`, `- `name` version: 1.2.3`, `Name version (GPU?): 1.2.3`; a bare `CUDA: 7.5` (Unsloth's
# banner prints the compute capability so) is no version of a library
_VERSION = re.compile(
    r"(?<![\w.-])`?(?P<name>pytorch|torch|transformers|vllm|deepspeed|flash[-_]attn|flash-attention|xformers|triton"
    r"|trl|peft|accelerate|megatron[-_]core|transformer[-_]engine|sglang|cuda toolkit)`?"
    r"(?: version)?(?: \([^)\n]{0,20}\))?\s{0,4}(?:==|:|=)\s{0,4}v?"
    r"(?P<version>\d{1,4}\.\d{1,4}(?:\.\d{1,6})?[\w+]*(?:\.[\w+]+)*)",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Version:
    """A library's version as a line of the log prints it."""

    library: str
    version: str
    line: int

    def __str__(self) -> str:
        return f"{self.library} {self.version} (line {self.line})"


def printed(lines: list[str]) -> list[Version]:
    """The first version each library's name is printed with in `lines` (the log's first lines, line 1 first)."""
    found: dict[str, Version] = {}
    for number, line in enumerate(lines, 1):
        for match in _VERSION.finditer(line[:1000]):
            library = _NAMES[match["name"].lower()]
            found.setdefault(library, Version(library, match["version"], number))
    return list(found.values())
