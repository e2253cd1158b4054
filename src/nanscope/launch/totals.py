"""A total loss beside its own terms: where a line prints the total first and one of its terms non-finite too, that
term is what went non-finite, and the total (their sum) follows from it; where several terms are, the line does not
say which went first (one record prints them at once, in its own order): the total, with its non-finite terms.

    [Total Loss, KL Loss, Reg Loss, Frame Loss] : [nan 0.5 2.301 nan]     -> Frame Loss
    [Total Loss, KL Loss, Reg Loss, Frame Loss] : [nan nan 2.301 nan]     -> Total Loss; KL Loss, Frame Loss (ClariNet#7)
    loss: nan (nan)  loss_classifier: nan (nan)  loss_box_reg: nan ...     -> loss; loss_classifier, loss_box_reg
    ValueError: total_loss=nan, policy_loss=nan, value_loss=1.2            -> policy_loss (a PPO guard's message)

A bare `loss` is taken for a total only beside two or more non-finite terms (`loss: nan, implicit loss: nan`, one
other loss, may be two losses of their own: JegZheng/truncated-diffusion-probabilistic-models#3, where `loss` is
thousands and `implicit loss` under 1); a total by name (`Total Loss`, `total_loss`, `losses`) beside one. A total
alone non-finite, its terms finite (`loss: nan - rpn_class_loss: 0.12 ...`, matterport Mask_RCNN#1162), stays
the total: no term says more. A term is a key that names a loss and is not itself a total (`lm loss` is Megatron's
language-model loss, a term of nothing on its line), nor the same loss seen another way (`val_loss`, `nll_loss`,
`reduced_train_loss`).

    metric = first_term(values)      # values: [(key, value)], the line's non-finite values in order
    terms = nonfinite_terms(values)  # the total's non-finite terms, where it heads them
"""

from __future__ import annotations

from nanscope.launch.line_shapes import AVERAGE

_TOTALS = frozenset(("loss", "losses", "total loss", "total", "loss total", "overall loss", "sum loss", "loss sum"))
# words of a key that is the same loss seen another way, not a term of it: a split's (val_loss, eval_loss), a
# reduction's (Lightning's reduced_train_loss beside its bar's running `loss`), fairseq's nll_loss beside its
# label-smoothed loss
_VARIANT = ("nll", "train", "val", "valid", "eval", "test", "reduced", "avg", "average", "mean", "smooth", "running",
            "ppl", "step", "epoch")  # fmt: skip


def is_total(key: str) -> bool:
    """Whether `key` names a total loss (`loss`, `Total Loss`, `total_loss`, `losses`)."""
    return key.lower().replace("_", " ").strip() in _TOTALS


def first_term(values: list[tuple[str, str]]) -> str | None:
    """The one non-finite term of a total by name that heads `values` (None: the first value is no total by name, or
    not exactly one term of it is non-finite on the line: none, or several, none of them first)."""
    terms = nonfinite_terms(values)  # a bare `loss` has none but two or more: one term is a total by name's
    return terms[0] if len(terms) == 1 else None


def nonfinite_terms(values: list[tuple[str, str]]) -> list[str]:
    """The non-finite terms of a total that heads `values`, in the line's order ([]: the first value is no total). A
    bare `loss` is a total beside two or more."""
    if not values or not is_total(values[0][0]):
        return []
    terms = [key for key, value in values[1:] if value != "missing" and _term(key)]
    spelled = values[0][0].lower().replace("_", " ").strip() != "loss"  # `Total Loss`, `losses`: a total by name
    return terms if spelled or len(terms) >= 2 else []


def _term(key: str) -> bool:
    if key.endswith(AVERAGE) or is_total(key) or "loss" not in key.lower():
        return False
    words = key.lower().replace("/", " ").replace("_", " ").replace(".", " ").split()
    return not any(word in _VARIANT for word in words)
