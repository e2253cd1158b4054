"""Which release a launch is for: --slime-version, the script's text, its flags, else v0.1.0 said."""

import pytest

from nanscope.errors import UserError
from nanscope.launch.detect import OVERRIDE, choose

TRAIN = ["--use-kl-loss"]


@pytest.mark.parametrize(
    ("line", "key", "match"),
    [
        ("docker pull slimerl/slime:v0.3.1", "v0.3.1", "slime:v0.3.1"),
        ("pip install slime==0.2.4", "v0.2.4", "slime==0.2.4"),
        ("cd /root/slime-0.2.4/ && ls", "v0.2.4", "slime-0.2.4"),
        ("SLIME_DIR=/opt/slime_v0.1.0", "v0.1.0", "slime_v0.1.0"),
        ("pip install git+https://github.com/THUDM/slime.git@v0.2.4", "v0.2.4", "slime.git@v0.2.4"),
        ("git -C /root/slime/624b824 log", "main", "slime/624b824"),
        ("pip install git+https://github.com/THUDM/slime@main", "main", "slime@main"),
    ],
)
def test_the_script_names_the_release(line, key, match):
    c = choose(None, "run.sh", f"#!/bin/bash\n{line}\npython3 train.py\n", TRAIN)
    assert (c.release.key, c.how, c.source) == (key, "script", f"run.sh line 2 names it: {match}")


def test_the_option_wins_over_the_script():
    c = choose("0.3.1", "run.sh", "image=slimerl/slime:v0.2.4\n", TRAIN)
    assert (c.release.key, c.how, c.source) == ("v0.3.1", "option", "--slime-version 0.3.1")


def test_a_checkpoint_named_slime_v1_5_names_no_release():
    # the bundled case's --load path: ..._slime_v1.5/ (two numbers, not a release)
    c = choose(None, "l.sh", "--load $X/Qwen3-235B_slime_v1.5/\n", TRAIN)
    assert (c.release.key, c.how, c.source) == (
        "v0.1.0",
        "assumed",
        f"nothing in the script names a release; {OVERRIDE}",
    )


def test_an_unknown_or_a_second_release_is_refused():
    with pytest.raises(UserError) as e:
        choose(None, "run.sh", "x\npip install slime==0.2.2\n", TRAIN)
    assert str(e.value) == (
        "run.sh: line 2 names slime 0.2.2 (slime==0.2.2), a release nanscope does not know (known: v0.1.0, "
        "v0.2.4, v0.3.1, main); pass --slime-version to use the defaults of one"
    )
    with pytest.raises(UserError) as e:
        choose(None, "run.sh", "A=slime-0.2.4\nB=slimerl/slime:v0.3.1\n", TRAIN)
    assert str(e.value) == (
        "run.sh: names two slime releases, v0.2.4 (line 1: slime-0.2.4) and v0.3.1 (line 2: slime:v0.3.1); "
        "pass --slime-version to choose one"
    )


def test_flags_that_exist_from_a_release_on():
    c = choose(None, "run.sh", "", ["--use-rollout-logprobs", "--kl-loss-type", "low_var_kl"])
    assert (c.release.key, c.how) == ("v0.2.4", "flags")
    assert c.source == (
        "the flags fit v0.2.4, v0.3.1, main: --use-rollout-logprobs (v0.2.4, v0.3.1, main); the oldest is assumed, "
        + OVERRIDE
    )
    assert choose(None, "run.sh", "", ["--advantage-estimator", "cispo"]).release.key == "v0.3.1"
    assert choose(None, "run.sh", "", ["--kl-loss-type", "kl"]).release.key == "v0.1.0"


def test_flags_no_release_has_leave_v0_1_0_assumed():
    c = choose(None, "run.sh", "", ["--kl-loss-type", "kl", "--use-rollout-logprobs"])
    assert (c.release.key, c.how) == ("v0.1.0", "assumed")
    assert c.source == (
        "the flags fit no one release: --kl-loss-type kl (v0.1.0); --use-rollout-logprobs (v0.2.4, v0.3.1, main); "
        + OVERRIDE
    )


def test_the_bundled_case_is_its_release():
    c = choose(None, "launch.sh", "slimerl/slime:v0.3.1", TRAIN, case="v0.1.0")
    assert (c.release.key, c.how) == ("v0.1.0", "case")
