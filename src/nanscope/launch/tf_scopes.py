"""TensorFlow's failing op, from the `{{node ...}}` path it prints under an InvalidArgumentError, and the model its
name scopes name:

    tensorflow.python.framework.errors_impl.InvalidArgumentError:  Invalid gradient: contains inf or nan. : ...
         [[{{node agent/StatefulPartitionedCall/.../policy_optimizer/VerifyFinite/CheckNumerics}}]]

(tensorforce#848, holdout8 18: tf.debugging.check_numerics in the policy's optimizer, whose scope is `policy_optimizer`;
stable-baselines#340's `loss/VerifyFinite/CheckNumerics` names no model.) The op is the path's last parts, with
TensorFlow's own call wrappers (`StatefulPartitionedCall`, `cond_1`, `then`, `_297`) left out.

    op = check_op(text)                 # "policy_optimizer/VerifyFinite/CheckNumerics", or None
    model = scope_model(op)             # ("policy", "policy_optimizer"), or None
"""

from __future__ import annotations

import re

from nanscope.facts.metric_names import NAME_MODELS

WINDOW = 4096  # characters of the line after the error read for its `{{node ...}}` path
# the path: a tf.function's nested calls and loops make it long (holdout23 12: 407 characters)
_NODE = re.compile(r"\{\{node (?P<path>[\w/.-]{1,2000})")
_WRAPPERS = re.compile(r"(?:StatefulPartitionedCall|PartitionedCall|cond(?:_\d{1,6})?|then|else|while|body|_\d{1,9})\Z")
_CHECKS = ("CheckNumerics", "VerifyFinite")
# a scope's first word -> the model (stable-baselines' `model/pi`, `model/vf`; TF-Agents' `ActorNetwork`)


def check_op(text: str) -> str | None:
    """The numerics check a `{{node ...}}` path on `text` names, as its last three meaningful parts; None: none."""
    if "{{node " not in text:
        return None
    match = _NODE.search(text)
    if match is None or not any(check in match["path"] for check in _CHECKS):
        return None
    parts = [part for part in match["path"].split("/") if part and not _WRAPPERS.match(part)]
    return "/".join(parts[-3:]) or None


def scope_model(op: str | None) -> tuple[str, str] | None:
    """(the model, the scope that names it) of the innermost scope of `op` whose first word names one; None: none."""
    for part in reversed((op or "").split("/")[:-1]):
        model = NAME_MODELS.get(part.split("_", 1)[0].lower())
        if model is not None:
            return model, part
    return None
