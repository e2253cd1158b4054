"""Which slime release's dump format a file is, read from its fields (the releases are `nanscope.facts.releases`).

    rollout dumps   {rollout_id, samples: [Sample.to_dict()]} in every release; Sample gained 13 fields in
                    v0.2.4 and 6 more in v0.3.1 (main: as v0.3.1). The newest release whose added fields
                    the first sample has is its format; a sample with fewer fields reads as v0.1.0.
    train dumps     v0.1.0 to v0.3.1: {rollout_id, rank, rollout_data: per-key lists}; v0.2.4 holds
                    rollout_log_probs as float32 where v0.1.0 holds bfloat16, v0.3.1 always adds
                    rollout_ids, rollout_mask_sums and the step schedule. main: {format_version: 2,
                    rollout_id, rank, samples: [one dict per sample], dp_shards, raw_reward}, its CP
                    fields restored to whole responses.

`fields_added` / `fields_removed` compare the file with v0.1.0's format: a rollout dump's sample keys with
v0.1.0's Sample fields, a train dump's keys with what v0.1.0's actor can write.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nanscope.facts import releases


@dataclass(frozen=True)
class DumpFormat:
    """The release format a dump was read as.

    Attributes:
        release: the oldest release that writes this format (nanscope.facts.releases key).
        same_as: every release whose dumps read the same (release first).
        fields_added: the file's fields that v0.1.0's format does not have, sorted.
        fields_removed: v0.1.0's fields the file lacks, in v0.1.0's order.
        rollout_logprob_dtype: what the release's trainer holds rollout_log_probs in ("bfloat16"/"float32").
        note: how the format was told apart, when not by fields alone.
    """

    release: str
    same_as: tuple[str, ...]
    fields_added: list[str] = field(default_factory=list)
    fields_removed: list[str] = field(default_factory=list)
    rollout_logprob_dtype: str = "bfloat16"
    note: str = ""

    def to_dict(self) -> dict:
        return {
            "release": self.release,
            "same_as": list(self.same_as),
            "fields_added": self.fields_added,
            "fields_removed": self.fields_removed,
            "rollout_logprob_dtype": self.rollout_logprob_dtype,
            "note": self.note,
        }


V0_1_0 = DumpFormat(releases.V0_1_0, (releases.V0_1_0,), note="samples converted by the caller: read as v0.1.0's")


def _made(
    release: str, keys, base: tuple[str, ...], same: tuple[str, ...], note: str = "", optional: tuple[str, ...] = ()
) -> DumpFormat:
    """A format: `keys` against v0.1.0's `base` fields (and the `optional` ones it may also have)."""
    return DumpFormat(
        release=release,
        same_as=same,
        fields_added=sorted(str(k) for k in keys if k not in base and k not in optional),
        fields_removed=[k for k in base if k not in keys],
        rollout_logprob_dtype=releases.BY_KEY[release].rollout_logprob_dtype,
        note=note,
    )


def rollout(sample_keys) -> DumpFormat:
    """A rollout dump's format from its first sample's keys."""
    keys = set(sample_keys)
    base = releases.BY_KEY[releases.V0_1_0].sample_fields
    found = next(r for r in reversed(releases.RELEASES) if set(r.sample_fields) - set(base) <= keys)
    same = tuple(r.key for r in releases.RELEASES if r.sample_fields == found.sample_fields)
    return _made(same[0], keys, base, same)


def train(data_keys, rollout_logprob_dtype: str | None) -> DumpFormat:
    """A rollout_data train dump's format (v0.1.0 to v0.3.1) from its keys and rollout_log_probs' dtype."""
    keys = set(data_keys)
    made = dict(keys=keys, base=releases.TRAIN_KEYS_V0_1_0, optional=releases.TRAIN_OPTIONAL_V0_1_0)
    layout = [r for r in releases.RELEASES if r.train_layout == "rollout_data"]
    marked = [r for r in layout if r.train_keys and set(r.train_keys) <= keys]
    if marked:
        return _made(marked[-1].key, same=(marked[-1].key,), **made)
    unmarked = [r for r in layout if not r.train_keys]
    if rollout_logprob_dtype is None:
        same = tuple(r.key for r in unmarked)
        return _made(same[0], same=same, note="no rollout_log_probs, whose dtype tells these apart", **made)
    fits = [r.key for r in unmarked if r.rollout_logprob_dtype == rollout_logprob_dtype]
    note = "told apart by rollout_log_probs' dtype"
    if not fits:
        return _made(
            releases.V0_1_0, same=(), note=f"rollout_log_probs as {rollout_logprob_dtype}: no release's", **made
        )
    return _made(fits[0], same=(fits[0],), note=note, **made)


def train_samples(sample_keys) -> DumpFormat:
    """main's train dump (format_version 2): one dict per sample; compared with v0.1.0's rollout_data keys."""
    same = tuple(r.key for r in releases.RELEASES if r.train_layout == "samples")
    note = "format_version 2: one dict per sample, CP fields gathered whole"
    keys = set(sample_keys)
    return _made(same[0], keys, releases.TRAIN_KEYS_V0_1_0, same, note=note, optional=releases.TRAIN_OPTIONAL_V0_1_0)
