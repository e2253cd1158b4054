"""The release table: spellings, the unknown-release refusal, per-release flag defaults and choices."""

import pytest

from nanscope.errors import UserError
from nanscope.facts import releases
from nanscope.facts.flags import BY_NAME, FLAGS, MEGATRON


@pytest.mark.parametrize(
    ("spelling", "key"),
    [("v0.1.0", "v0.1.0"), ("0.2.4", "v0.2.4"), ("V0.3.1", "v0.3.1"), (" main ", "main"), ("624b824", "main")],
)
def test_spellings(spelling, key):
    assert releases.get(spelling).key == key


@pytest.mark.parametrize("spelling", ["0.2.2", "v0.3.0", "latest", "v0.2.4.1", ""])
def test_unknown_release_is_one_line(spelling):
    with pytest.raises(UserError) as e:
        releases.get(spelling)
    assert str(e.value) == f"unknown slime release {spelling!r} (known: v0.1.0, v0.2.4, v0.3.1, main)"


def test_the_plugin_names_its_releases_from_the_table():
    assert [r.name for r in reversed(releases.LOSS_APIS)] == [r.name for r in releases.RELEASES]


def test_kl_loss_type_default_and_choices_per_release():
    spec = BY_NAME["kl_loss_type"]
    assert [spec.default_at(k) for k in releases.KEYS] == ["kl", "k1", "k1", "k1"]
    assert spec.choices_at("v0.1.0") == ("kl", "k2", "k3", "low_var_kl")
    assert spec.choices_at("main") == ("k1", "k2", "k3", "low_var_kl")


def test_advantage_estimators_grow():
    spec = BY_NAME["advantage_estimator"]
    added = [
        sorted(set(spec.choices_at(b)) - set(spec.choices_at(a))) for a, b in zip(releases.KEYS, releases.KEYS[1:])
    ]
    assert added == [["ppo"], ["cispo"], []]


def test_flags_from_v0_2_4_and_megatron_flags_in_every_release():
    assert [BY_NAME["use_rollout_logprobs"].defined_at(k) for k in releases.KEYS] == [False, True, True, True]
    assert all(f.defined_at(k) for f in FLAGS if f.owner == MEGATRON for k in releases.KEYS)


def test_sample_fields_grow_by_13_then_6():
    v1, v2, v3, main = (set(r.sample_fields) for r in releases.RELEASES)
    assert (len(v1), len(v2 - v1), len(v3 - v2), v1 <= v2 <= v3, main == v3) == (11, 13, 6, True, True)
