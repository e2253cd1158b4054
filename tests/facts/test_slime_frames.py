"""slime's frames per release (facts.slime_frames), checked against slime's own code at each tag: the call each
frame makes to the next spans exactly the lines the table says (NANSCOPE_SLIME_SRC, one checkout per tag: CI's
../shared/slime-src by default, tests/checkouts.py)."""

import ast

import pytest

from nanscope.facts import slime_frames
from tests.checkouts import slime_release

CALLEES = {  # the next frame's call in each function
    ("train.py", "<module>"): ("train",),
    ("train.py", "train"): ("ray.get",),
    ("slime/backends/megatron_utils/actor.py", "train"): ("train", "self.train_actor"),
    ("slime/backends/megatron_utils/actor.py", "train_actor"): ("train",),
    ("slime/backends/megatron_utils/model.py", "train"): ("train_one_step",),
    ("slime/backends/megatron_utils/model.py", "train_one_step"): ("forward_backward_func",),
}


def _calls(tree: ast.Module, function: str, callees: tuple[str, ...]) -> set[tuple[int, int]]:
    if function == "<module>":
        nodes = [
            n for stmt in tree.body if not isinstance(stmt, (ast.FunctionDef, ast.ClassDef)) for n in ast.walk(stmt)
        ]
    else:
        nodes = [
            n for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name == function for n in ast.walk(f)
        ]
    return {(n.lineno, n.end_lineno) for n in nodes if isinstance(n, ast.Call) and ast.unparse(n.func) in callees}


@pytest.mark.parametrize("key", sorted(slime_frames.FRAMES))
def test_each_release_calls_the_next_frame_from_those_lines(key):
    suffix, function = key
    for release, spans in slime_frames.FRAMES[key].items():
        path = slime_release(release) / suffix
        calls = _calls(ast.parse(path.read_text()), function, CALLEES[key])
        assert set(spans) <= calls, (release, sorted(calls))
        if suffix != "train.py":  # slime's package: exactly these calls
            assert set(spans) == calls, (release, sorted(calls))
