"""A dump's fields converted to arrays, each checked first against the limits (`Fields`), and values as error
lines show them.

Nothing a file declares is trusted: a tensor must be dense, on the CPU, 1-D and contiguous inside its own
storage (a stride-0 view declaring 10^10 elements over one is refused, as are meta, sparse, quantized and
nested tensors); a field holds at most `Limits.max_sample_tokens` entries; and every entry converted is
charged to the file's `Budget`. Every refusal is one line: `{path}: {field} of sample {i}: ...`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nanscope.dumps.limits import Budget, Limits
from nanscope.dumps.unpickler import CList
from nanscope.errors import UserError

SEQUENCES = (list, tuple, CList)  # what a field that holds a list may be


class Fields:
    """Converts one sample's fields, refusing before any allocation what the limits do not allow.

    Every message is one line: `{path}: {field} of sample {i}: ...`.
    """

    def __init__(self, path: str, limits: Limits, budget: Budget):
        self.path, self.limits, self.budget = path, limits, budget

    def _error(self, name: str, i: int, what: str) -> UserError:
        return UserError(f"{self.path}: {name} of sample {i}: {what}")

    def _capped(self, n: int, name: str, i: int, what: str = "entries") -> int:
        cap = self.limits.max_sample_tokens
        if n > cap:
            raise self._error(
                name, i, f"{n:,} {what}, over the per-sample cap of {cap:,} (raise it with --max-sample-tokens)"
            )
        return n

    def tensor(self, x: Any, name: str, i: int) -> Any:
        """`x` if it is a plain dense CPU tensor whose elements all lie in its own storage, once each."""
        import torch  # heavy: torch, only for the tensors a file holds

        if type(x) not in (torch.Tensor, torch.nn.Parameter) or x.is_quantized or x.is_nested:
            raise self._error(name, i, f"a {type(x).__name__} tensor, expected a plain tensor")
        if x.layout != torch.strided:
            raise self._error(name, i, f"a {str(x.layout).removeprefix('torch.')} tensor, expected a dense one")
        if x.device.type != "cpu":
            raise self._error(name, i, f"a tensor on device {x.device.type} (no data in the file), expected cpu")
        if x.dim() > 1:
            raise self._error(name, i, f"tensor of shape {tuple(x.shape)}, expected 1-D")
        n = x.numel()
        if n > 1 and x.stride(0) != 1:
            raise self._error(
                name,
                i,
                f"tensor of {n:,} elements with stride {x.stride(0)} over a storage of "
                f"{_storage_len(x):,}, expected a contiguous one",
            )
        if x.storage_offset() + n > _storage_len(x):
            raise self._error(
                name,
                i,
                f"tensor of {n:,} elements at offset {x.storage_offset():,} past its storage of {_storage_len(x):,}",
            )
        return x

    def length(self, x: Any, name: str, i: int) -> int:
        if is_tensor(x):
            if self.tensor(x, name, i).dim() != 1:
                raise self._error(name, i, f"tensor of shape {tuple(x.shape)}, expected 1-D")
            return self._capped(x.numel(), name, i)
        if not isinstance(x, SEQUENCES):
            raise self._error(name, i, f"{type_name(x)}, expected a list")
        return self._capped(len(x), name, i)

    def int(self, x: Any, name: str, i: int) -> int:
        if is_tensor(x) and self.tensor(x, name, i).numel() == 1:
            x = x.item()
        if isinstance(x, bool) or not isinstance(x, int):
            raise self._error(name, i, f"{brief(x)}, expected an int")
        return x

    def response_length(self, x: Any, name: str, i: int) -> int:
        """A declared response length: an int in [0, the per-sample cap]."""
        n = self.int(x, name, i)
        if n < 0:
            raise UserError(f"{self.path}: {name} of sample {i}: {n} is negative")
        return self._capped(n, name, i, "tokens declared")

    def default_mask(self, response_length: int, tokens_length: int, name: str, i: int) -> np.ndarray:
        """slime's all-ones loss mask of a sample that has none: int8 [response_length]; empty when
        response_length > tokens_length, a length mismatch whose sample is not checked further."""
        n = response_length if response_length <= tokens_length else 0
        self.budget.take(n, name, i)
        return np.ones(n, dtype=np.int8)

    def floats(self, x: Any, name: str, i: int) -> np.ndarray:
        """A 1-D list/tensor of numbers as float32 (tensors keep their values; bf16 widens exactly)."""
        if is_tensor(x):
            import torch  # heavy: torch, only for the tensors a file holds

            self.tensor(x, name, i)
            if x.dim() != 1 or not x.dtype.is_floating_point:
                raise self._error(name, i, f"tensor {x.dtype} {tuple(x.shape)}, expected 1-D float")
            self.budget.take(self._capped(x.numel(), name, i), name, i)
            x = x.detach()
            if x.dtype == torch.bfloat16:  # widen exactly by bit shift: bf16 is the top half of an fp32
                return (x.view(torch.int16).numpy().view(np.uint16).astype(np.uint32) << 16).view(np.float32)
            return x.float().numpy()
        if not isinstance(x, SEQUENCES):
            raise self._error(name, i, f"{type_name(x)}, expected a list of floats")
        self.budget.take(self._capped(len(x), name, i), name, i)
        if type(x) is CList:  # all number runs: already an array; else the list it stands for
            values = x.array()
            if values is not None:
                return values.astype(np.float64, copy=False)
            x = x.tolist()
        try:
            values = np.array(x, dtype=np.float64)
        except (TypeError, ValueError, OverflowError, RecursionError):
            bad = next((j for j, v in enumerate(x) if isinstance(v, bool) or not isinstance(v, (int, float))), None)
            where = f"element {bad} is {type_name(x[bad])}" if bad is not None else "not a flat list of numbers"
            raise self._error(name, i, where) from None
        if values.ndim != 1:
            raise self._error(name, i, "not a flat list of numbers")
        nan_at = np.flatnonzero(np.isnan(values))
        none_at = next((int(j) for j in nan_at if x[j] is None), None)  # numpy turns None into nan
        if none_at is not None:
            raise self._error(name, i, f"element {none_at} is None")
        return values

    def token_ids(self, x: Any, name: str, i: int) -> np.ndarray:
        """A 1-D list/tensor of token ids as int64."""
        if is_tensor(x):
            import torch  # heavy: torch, only for the tensors a file holds

            self.tensor(x, name, i)
            if x.dim() != 1 or x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
                raise self._error(name, i, f"tensor {x.dtype} {tuple(x.shape)}, expected 1-D integer")
            self.budget.take(self._capped(x.numel(), name, i), name, i)
            return x.detach().numpy().astype(np.int64)
        if not isinstance(x, SEQUENCES):
            raise self._error(name, i, f"{type_name(x)}, expected a list of token ids")
        self.budget.take(self._capped(len(x), name, i), name, i)
        ids = x.array() if type(x) is CList else None
        if ids is None:  # some entries are Python objects: each must be an int
            values = x.tolist() if type(x) is CList else x
            bad = next((j for j, v in enumerate(values) if isinstance(v, bool) or not isinstance(v, int)), None)
            if bad is not None:
                raise self._error(name, i, f"element {bad} is {type_name(values[bad])}, expected an int")
            try:
                ids = np.array(values, dtype=np.int64)
            except OverflowError:
                raise self._error(name, i, "a token id beyond int64") from None
        elif ids.size and ids.dtype.kind not in "iu":  # a run of floats
            raise self._error(name, i, f"element 0 is {ids.dtype}, expected an int")
        return ids.astype(np.int64, copy=False)

    def mask(self, x: Any, name: str, i: int) -> np.ndarray:
        """A loss mask as int8; values other than 0/1 are malformed."""
        if is_tensor(x):
            self.tensor(x, name, i)
            if x.dim() != 1:
                raise self._error(name, i, f"tensor of shape {tuple(x.shape)}, expected 1-D")
            self.budget.take(self._capped(x.numel(), name, i), name, i)
            values = x.detach().numpy()
        elif isinstance(x, SEQUENCES):
            self.budget.take(self._capped(len(x), name, i), name, i)
            values = x.array() if type(x) is CList else None
            try:
                values = np.array(x.tolist() if type(x) is CList else x) if values is None else values
            except (TypeError, ValueError, OverflowError, RecursionError):
                raise self._error(name, i, "not a flat list of 0/1") from None
        else:
            raise self._error(name, i, f"{type_name(x)}, expected a list of 0/1")
        if values.ndim != 1 or (values.size and values.dtype.kind not in "biuf"):
            raise self._error(name, i, "not a flat list of 0/1")
        if values.size and ((values != 0) & (values != 1)).any():
            j = int(np.flatnonzero((values != 0) & (values != 1))[0])
            raise self._error(name, i, f"element {j} is {values[j]}, expected 0 or 1")
        return values.astype(np.int8, copy=False)

    def reward(self, reward: Any, i: int, reward_key: str | None) -> float:
        """slime's Sample.get_reward_value: reward, or reward[reward_key] with --reward-key."""
        if reward_key is not None:
            if not isinstance(reward, dict):
                raise self._error(
                    "reward", i, f"--reward-key {reward_key} given but reward is {type_name(reward)}, not a dict"
                )
            if reward_key not in reward:
                raise self._error("reward", i, f"no key '{reward_key}' (has {keys_text(reward)})")
            reward = reward[reward_key]
        elif isinstance(reward, dict):
            raise self._error("reward", i, f"a dict with keys {keys_text(reward)}; pass --reward-key")
        if is_tensor(reward) and self.tensor(reward, "reward", i).numel() == 1:
            reward = reward.item()
        if isinstance(reward, bool) or not isinstance(reward, (int, float)):
            raise self._error(
                "reward",
                i,
                f"{brief(reward)}, expected a number (slime v0.1.0 builds a float tensor from the rewards)",
            )
        if isinstance(reward, int) and reward.bit_length() > 1024:
            raise self._error("reward", i, f"{brief(reward)}, too large for the float tensor slime v0.1.0 builds")
        return float(reward)


# ------------------------------------------------------------------------------------- values in messages


def stored_rollout_id(x: Any) -> int | float | str | None:
    """The stored rollout id as reports can show it: a plain number or string, else its type in brackets."""
    if x is None or isinstance(x, (int, float)):
        return x
    return x[:200] if isinstance(x, str) else f"<{type(x).__name__}>"


def type_name(x: Any) -> str:
    """A value's type for an error line: a CList is the list the file holds."""
    return "list" if type(x) is CList else type(x).__name__


def entry(column: Any, i: int) -> Any:
    """Entry i of a per-sample list (a CList gives Python numbers for its number runs)."""
    return column.item(i) if type(column) is CList else column[i]


def is_tensor(x: Any) -> bool:
    import torch  # heavy: torch, only for the tensors a file holds

    return isinstance(x, torch.Tensor)


def _storage_len(x: Any) -> int:
    """Elements of x's dtype its storage holds (the bytes the file gave it)."""
    return x.untyped_storage().nbytes() // x.element_size()


def brief(x: Any) -> str:
    """A value for an error line: the type and a short repr of a scalar; only the type of anything else,
    whose repr could be huge or nested deeper than Python's recursion limit."""
    if isinstance(x, int) and x.bit_length() > 64:
        return f"int of {x.bit_length()} bits"
    if x is None or isinstance(x, (int, float, str)):
        return f"{type(x).__name__} {x!r:.40}"
    return type_name(x)


def keys_text(d: dict) -> list[str]:
    """The first 8 of a dict's keys as text, sorted (see `_key_text`)."""
    return sorted(map(_key_text, d))[:8]


def _key_text(k: Any) -> str:
    """A key as text: a string cut to 40 characters, an int of up to 64 bits as is, else its type in brackets."""
    if isinstance(k, str):
        return k[:40]
    if isinstance(k, int) and k.bit_length() <= 64:
        return str(k)
    return f"<{type(k).__name__}>"
