"""The release table against each slime checkout: its Sample and dump writers, and its parser's flags.

Needs NANSCOPE_SLIME_SRC (one checkout per tag; tests/checkouts.py). The dumps: dump_worker.py has each
release's own Sample and writers write nanscope's demo dumps next to nanscope's writers; both must read
as that release's format and give the same findings. The flags: slime/utils/arguments.py is read (never
imported) and every modelled slime flag's presence, default and choices must be the table's, and every
flag a doctor fix names must be one the release's parser (or Megatron's, or SGLang's) defines.
"""

import ast
import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from nanscope import case
from nanscope.dumps import checks, io
from nanscope.facts import releases
from nanscope.facts.flags import FLAGS, MEGATRON, SLIME
from tests.checkouts import RELEASES, slime_release
from tests.dumps.test_checks import rows
from tests.launch.test_findings import UNMODELLED_FIX_FLAGS, fix_flags

WORKER = Path(__file__).with_name("dump_worker.py")
# Modelled as slime's but parsed elsewhere: Megatron's --global-batch-size, SGLang's --sglang-context-length.
NOT_SLIME_PARSED = {"--global-batch-size", "--sglang-context-length"}


def _checkout(tag: str) -> Path:
    return slime_release(tag)


@pytest.fixture(scope="module", params=RELEASES)
def written(request, tmp_path_factory):
    """(release key, the worker's output directory) for one release."""
    out = tmp_path_factory.mktemp(request.param)
    cmd = [sys.executable, str(WORKER), "--slime-src", str(_checkout(request.param)), "--release", request.param]
    proc = subprocess.run([*cmd, "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return request.param, out


def test_sample_fields_are_the_release_s(written):
    tag, out = written
    facts = json.loads((out / "facts.json").read_text())
    assert facts["fields"] == list(releases.BY_KEY[tag].sample_fields)
    assert facts["roundtrip"]  # Sample.from_dict(ours).to_dict() == ours, keys in order


@pytest.mark.parametrize("kind", ["rollout", "train"])
def test_the_release_s_writers_read_as_its_format_with_our_findings(written, kind):
    tag, out = written
    real, ours = (checks.scan(io.load(out / f"{who}-{kind}.pt"), case.scan_config()) for who in ("real", "ours"))
    detected = "v0.3.1" if (tag, kind) == ("main", "rollout") else tag  # main's Sample is v0.3.1's
    assert (real.format.release, real.format) == (detected, ours.format)
    assert rows(real) == rows(ours) and real.hazards
    assert (real.rollout_id, real.rank, real.verdict) == (ours.rollout_id, ours.rank, ours.verdict)
    a, b = (torch.load(out / f"{who}-{kind}.pt", weights_only=True) for who in ("real", "ours"))
    assert list(a) == list(b)
    if "samples" in a:
        assert [list(s) for s in a["samples"]] == [list(s) for s in b["samples"]]


def _parser_flags(tag: str) -> dict[str, dict]:
    """--flag -> {default, action, choices} from the release's slime/utils/arguments.py (literals only)."""
    with warnings.catch_warnings():  # the release's own "\\." in non-raw strings
        warnings.simplefilter("ignore", SyntaxWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        tree = ast.parse((_checkout(tag) / "slime" / "utils" / "arguments.py").read_text())
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            kw = {k.arg: k.value for k in node.keywords}
            value = {k: _literal(kw[k]) if k in kw else None for k in ("default", "action", "choices")}
            for arg in node.args:
                if isinstance(arg, ast.Constant) and str(arg.value).startswith("--"):
                    out[arg.value] = value
    return out


def _literal(node):
    """A keyword's value if it is a literal, else its source text (a default computed from a name)."""
    try:
        return ast.literal_eval(node)
    except ValueError:
        return ast.unparse(node)


@pytest.mark.parametrize("tag", RELEASES)
def test_modelled_flags_defaults_and_choices_are_the_release_s(tag):
    parsed = _parser_flags(tag)
    for spec in FLAGS:
        if spec.owner != SLIME or spec.spelling in NOT_SLIME_PARSED:
            continue
        assert spec.defined_at(tag) == (spec.spelling in parsed), (tag, spec.spelling)
        if spec.spelling not in parsed:
            continue
        p = parsed[spec.spelling]
        want = {"true": False, "false": True}.get(spec.kind, p["default"])  # store_true / store_false
        assert spec.default_at(tag) == want, (tag, spec.spelling, p)
        assert spec.choices_at(tag) == tuple(p["choices"] or ()), (tag, spec.spelling)


@pytest.mark.parametrize("tag", RELEASES)
def test_doctor_fixes_name_flags_the_release_parses(tag):
    parsed = set(_parser_flags(tag))
    megatron = {f.spelling for f in FLAGS if f.owner == MEGATRON} | NOT_SLIME_PARSED
    named = fix_flags(tag)
    assert named - parsed - megatron == set(), tag
    assert UNMODELLED_FIX_FLAGS <= parsed
