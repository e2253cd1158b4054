"""slime's policy loss as two modules with one signature: `as_is` (slime v0.1.0, defects included) and `safe` (the fix).

    formulas.py   every formula once, as pure functions on tensors
    layout.py     slime's context-parallel zigzag: which response positions a CP rank holds
    microbatch.py slime's micro-batch: CP slicing, the per-sample-mean reducer, TP log-probs
    as_is.py      slime v0.1.0's loss_function / policy_loss
    safe.py       the same with the fix (clamp before exp, masks by selection, NaN guards)

`LOSSES` names them as the CLI and JSON do; `get(name)` is the one lookup (`known(name)` checks a name
without importing torch).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from nanscope.errors import UserError

# CLI / JSON name -> module under nanscope.loss.
LOSSES = {"as-is": "nanscope.loss.as_is", "safe": "nanscope.loss.safe"}
NAMES = tuple(LOSSES)


def get(name: str) -> ModuleType:
    """The loss module called `name`; an unknown name is a UserError listing the known ones."""
    return importlib.import_module(LOSSES[known(name)])


def known(name: str) -> str:
    """`name`, if it names a loss; else a UserError listing the known ones."""
    if name not in LOSSES:
        raise UserError(f"unknown loss {name!r}; known: {', '.join(LOSSES)}")
    return name
