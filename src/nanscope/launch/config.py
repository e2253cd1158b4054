"""The resolved configuration of a slime run: flags, their defaults, and where each value came from.

slime parses one argparse namespace (Megatron's flags plus its own). Only the fields that matter for
layout and NaN mechanisms are modelled here; each resolved value remembers its origin: the launch
script, the architecture JSON, the slime release's default, Megatron core_v0.15.0rc0's default, or a
rule slime applies after parsing (`eps_clip_high = eps_clip`, `--colocate` forces the rollout GPUs, ...).

The table of flags and their defaults is `nanscope.facts.flags.FLAGS`. A modelled flag the release does
not define is left out of the resolved values (`Config.get` reads it as absent); the script's use of it is in
`Config.undefined`, a value outside the release's choices in `Config.rejected`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from nanscope.errors import UserError
from nanscope.facts import releases
from nanscope.facts.flags import BY_NAME, FLAGS, MODEL_ALIASES, SCRIPT, SLIME, Flag, eps_clip_high, slime_default

_INT64 = 1 << 63  # slime and Megatron hand integer flags to torch and C++: 64-bit


@dataclass
class Value:
    """A resolved value and where it came from."""

    value: object
    origin: str


@dataclass
class Config:
    """Resolved configuration.

    Attributes:
        values: field name -> Value, for every modelled flag the release defines (and derived fields).
        given: every `--flag` in the argument list -> its raw words (modelled or not).
        notes: what slime/Megatron change after parsing, in words.
        release: the slime release whose defaults and rules apply (nanscope.facts.releases key).
        undefined: modelled flags the script gives that the release does not define, as written.
        rejected: (flag, value, the release's choices) for a value its parser rejects.
        unread: (path as written, line) of each file the script sources that was not read (missing, no
            --model-args in its place): the flags in it are unknown, so a cause they decide stays open (launch.moe).
        unknown: flags whose value is script text that reads unset variables -> that text; their value is the
            default, or what doctor infers (launch.inference), and their origin says so.
    """

    values: dict[str, Value]
    given: dict[str, list[str]]
    notes: list[str] = field(default_factory=list)
    release: str = releases.V0_1_0
    undefined: list[str] = field(default_factory=list)
    rejected: list[tuple[str, str, tuple[str, ...]]] = field(default_factory=list)
    unread: list[tuple[str, int]] = field(default_factory=list)
    unknown: dict[str, str] = field(default_factory=dict)

    def __getitem__(self, name: str):
        return self.values[name].value

    def get(self, name: str, absent=False):
        """A flag's value, or `absent` where the release does not define it."""
        resolved = self.values.get(name)
        return absent if resolved is None else resolved.value

    def origin(self, name: str) -> str:
        return self.values[name].origin

    def flag_text(self, name: str) -> str:
        """`--flag value` as the user would write it, for evidence lists."""
        spec = BY_NAME[name]
        value = self[name]
        if spec.kind in ("true", "false"):
            on = value if spec.kind == "true" else not value
            return spec.spelling if on else f"(no {spec.spelling})"
        if value is None:  # unset, and no default: not Python's word for it (`--rm-type None`)
            return f"(no {spec.spelling})"
        return f"{spec.spelling} {_show(value)}"


def _show(value) -> str:
    if isinstance(value, (list, tuple)):  # nargs + flags: the words as written
        return " ".join(_show(item) for item in value)
    if isinstance(value, float) and value == int(value) and abs(value) < 1e15:
        return f"{value:g}"
    return str(value)


def split_flags(argv: list[str]) -> dict[str, list[str]]:
    """Group an argument list into `--flag -> values` (the last occurrence wins, as in argparse).

    `--flag=value` is split; words up to the next `--word` are the flag's values.
    """
    out: dict[str, list[str]] = {}
    current = None
    for word in argv:
        if word.startswith("--") and len(word) > 2:
            name, eq, value = word.partition("=")
            out[name] = [value] if eq else []
            current = name
        elif current is not None:
            out[current].append(word)
    return out


def _convert(spec: Flag, words: list[str], unset: dict[str, int], kept: dict[str, str]):
    if spec.kind == "true":
        return True
    if spec.kind == "false":
        return False
    if spec.kind == "list":
        return list(words)
    if spec.kind == "floats":
        if not words:
            raise UserError(f"{spec.spelling}: expected one or more numbers, got none")
        return [_number(spec, word, words, unset, kept) for word in words]
    if len(words) != 1:
        shown = _short(" ".join(words)) or "(none)"
        raise UserError(f"{spec.spelling}: expected one value, got {len(words)}: {shown}{_hint(words, unset, kept)}")
    return _number(spec, words[0], words, unset, kept)


def _number(spec: Flag, word: str, words: list[str], unset: dict[str, int], kept: dict[str, str]):
    """One word of a flag as its kind: an int, a finite float ("float", "floats") or the word itself."""
    integer = spec.kind == "int"
    try:
        value = int(word) if integer else float(word) if spec.kind in ("float", "floats") else word
    except ValueError:
        raise UserError(
            f"{spec.spelling}: {_short(word)!r} is not a{'n integer' if integer else ' number'}"
            f"{_hint(words, unset, kept)}"
        ) from None
    if integer and not -_INT64 <= value < _INT64:
        raise UserError(f"{spec.spelling}: {_short(word)} is not a 64-bit integer")
    if isinstance(value, float) and not math.isfinite(value):
        raise UserError(f"{spec.spelling}: {word!r} is not a finite number")
    return value


def _short(text: str, most: int = 80) -> str:
    return text if len(text) <= most else text[:most] + "..."


def _hint(words: list[str], unset: dict[str, int], kept: dict[str, str]) -> str:
    """Why a value is still script text: a reading limit it hit, or the unset variables it may read."""
    text = " ".join(words)
    reason = next((why for placeholder, why in kept.items() if placeholder in text), None)
    if reason is not None:
        return f" (kept as text: {reason})"
    if not unset or "$" not in text:
        return ""
    return f" (the script reads unset variables: {', '.join(sorted(unset))}; pass --env NAME=VALUE)"


def _unset_text(words: list[str], unset: dict[str, int], kept: dict[str, str]) -> bool:
    """A value of script text that reads unset variables (not one kept at a reading limit): unknown, not wrong."""
    text = " ".join(words)
    return bool(unset) and "$" in text and not any(placeholder in text for placeholder in kept)


def _model_value(spec: Flag, value, origin: str):
    expected = {"int": int, "float": (int, float), "str": str}[spec.kind]
    if isinstance(value, bool) or not isinstance(value, expected):
        raise UserError(f"{origin}: {spec.name}: expected {spec.kind}, got {_short(repr(value))}")
    if isinstance(value, int) and not -_INT64 <= value < _INT64:
        raise UserError(f"{origin}: {spec.name}: {_short(str(value))} is not a 64-bit integer")
    if isinstance(value, float) and not math.isfinite(value):
        raise UserError(f"{origin}: {spec.name}: {value} is not a finite number")
    return value


def resolve(
    argv: list[str],
    model: dict | None = None,
    model_origin: str = "model.json",
    unset: dict[str, int] | None = None,
    kept: dict[str, str] | None = None,
    release: str = releases.V0_1_0,
) -> Config:
    """Apply a slime release's and Megatron's defaults and post-parse rules to an argument list.

    Args:
        argv: the words after `python3 train.py`.
        model: architecture facts (`num_layers`, `num_experts`, ...) used where the argument list
            has no such flag (the model-args file was not shared).
        model_origin: how to name `model` in origins, e.g. "model.json (bundled with slime-795)".
        unset: variables the script read but never set (for error hints).
        kept: script text kept in place of a value at a reading limit -> why (for error hints).
        release: the slime release (nanscope.facts.releases key) whose defaults, choices and flags apply.

    Raises:
        UserError: a modelled flag with a value of the wrong type.
    """
    given = split_flags(argv)
    if model:
        model = {**{MODEL_ALIASES[key]: value for key, value in model.items() if key in MODEL_ALIASES}, **model}
    cfg = Config({}, given, release=release)
    for spec in FLAGS:
        if not spec.defined_at(release):
            if spec.spelling in given:
                cfg.undefined.append(spec.spelling)
        elif (
            spec.spelling in given
            and spec.kind in ("int", "float", "floats")
            and _unset_text(given[spec.spelling], unset or {}, kept or {})
        ):
            text = " ".join(given[spec.spelling])
            cfg.unknown[spec.name] = text
            default = spec.default_at(release)
            origin = f"unknown: the script gives {_short(text)!r}, which reads variables it never sets"
            cfg.values[spec.name] = Value(
                default, f"{origin}; {'no value' if default is None else 'the default'} assumed"
            )
        elif spec.spelling in given:
            value = _convert(spec, given[spec.spelling], unset or {}, kept or {})
            if spec.choices_at(release) and value not in spec.choices_at(release):
                cfg.rejected.append((spec.spelling, value, spec.choices_at(release)))
            cfg.values[spec.name] = Value(value, SCRIPT)
        elif model and spec.name in model and spec.kind in ("int", "float", "str"):
            cfg.values[spec.name] = Value(_model_value(spec, model[spec.name], model_origin), model_origin)
        else:
            origin = slime_default(release) if spec.owner == SLIME else spec.owner
            cfg.values[spec.name] = Value(spec.default_at(release), origin)
    _post_parse(cfg)
    return cfg


def _post_parse(cfg: Config) -> None:
    """What slime's parse_args and Megatron's validate_args change after parsing (the same in every release here:
    v0.1.0 arguments.py:939-997, v0.2.4 :1609-1698, v0.3.1 :1818-1918, main :1877-1982)."""
    values = cfg.values
    if values["eps_clip_high"].value is None:
        values["eps_clip_high"] = Value(
            eps_clip_high(values["eps_clip"].value, None), "derived (slime: eps_clip_high = eps_clip)"
        )
    if values["expert_tensor_parallel_size"].value is None:
        values["expert_tensor_parallel_size"] = Value(
            values["tensor_model_parallel_size"].value, "derived (megatron: expert_tensor_parallel_size = tp)"
        )
    if values["rollout_num_gpus_per_engine"].value < 1:
        raise UserError(f"--rollout-num-gpus-per-engine {values['rollout_num_gpus_per_engine'].value}: must be >= 1")
    if values["colocate"].value:
        values["offload"] = Value(True, "derived (slime: --colocate sets --offload)")
    world = values["actor_num_nodes"].value * values["actor_num_gpus_per_node"].value
    if values["colocate"].value and values["rollout_num_gpus"].value != world:
        if values["rollout_num_gpus"].origin == SCRIPT:
            cfg.notes.append(
                f"--colocate: slime overrides --rollout-num-gpus {values['rollout_num_gpus'].value} "
                f"with the actor GPUs ({world})"
            )
        values["rollout_num_gpus"] = Value(world, "derived (slime: --colocate uses the actor GPUs)")
    if values["n_samples_per_prompt"].value == 1 and values["grpo_std_normalization"].value:
        values["grpo_std_normalization"] = Value(False, "derived (slime: n_samples_per_prompt 1)")
    if values["global_batch_size"].value is None and values["num_steps_per_rollout"].value:
        steps, prompts = values["num_steps_per_rollout"].value, values["rollout_batch_size"].value
        if prompts:
            global_batch = prompts * values["n_samples_per_prompt"].value // steps
            values["global_batch_size"] = Value(
                global_batch, "derived (slime: rollout x n-samples / num-steps-per-rollout)"
            )
    # No slime release here initialises Megatron's RerunStateMachine, so it is created implicitly in mode
    # DISABLED whatever --rerun-mode says (validate_result then raises on a rejected result).
    cfg.values["rerun_mode_effective"] = Value(
        "disabled", f"slime {cfg.release} never calls initialize_rerun_state_machine (implicit DISABLED)"
    )
    if values["rerun_mode"].origin == SCRIPT and values["rerun_mode"].value != "disabled":
        cfg.notes.append(
            f"--rerun-mode {values['rerun_mode'].value} has no effect under slime {cfg.release} "
            "(the rerun state machine is never initialised: mode disabled)"
        )


@dataclass
class Batches:
    """Derived batch and length figures of one rollout.

    Attributes:
        samples_per_rollout: rollout-batch-size x n-samples-per-prompt.
        global_batch: samples per optimizer step (Megatron: micro-batch x DP when unset).
        steps_per_rollout: optimizer steps per rollout (slime's num_steps_per_rollout).
        budget_tokens: tokens one micro-batch may hold per CP group (max-tokens-per-gpu x CP), or None.
        longest_sample: the longest sample the flags allow (prompt + response), or None if unbounded.
        longest_from: which flags bound it, in words.
    """

    samples_per_rollout: int | None
    global_batch: int | None
    global_batch_origin: str
    steps_per_rollout: int | None
    steps_remainder: int
    budget_tokens: int | None
    longest_sample: int | None
    longest_from: str


def batches(cfg: Config, dp: int, cp: int) -> Batches:
    """Samples per rollout, optimizer steps per rollout, micro-batch token budget vs the longest sample."""
    prompts, group_size = cfg["rollout_batch_size"], cfg["n_samples_per_prompt"]
    samples = prompts * group_size if prompts is not None else None
    global_batch, global_batch_origin = cfg["global_batch_size"], cfg.origin("global_batch_size")
    if global_batch is None:
        global_batch, global_batch_origin = cfg["micro_batch_size"] * dp, "derived (megatron: micro-batch-size x dp)"
    steps = samples // global_batch if samples is not None and global_batch else None
    remainder = samples % global_batch if samples is not None and global_batch else 0
    budget = cfg["max_tokens_per_gpu"] * cp if cfg["use_dynamic_batch_size"] and cfg["max_tokens_per_gpu"] else None
    bounds = []
    if cfg["sglang_context_length"] is not None:
        bounds.append((cfg["sglang_context_length"], f"--sglang-context-length {cfg['sglang_context_length']}"))
    response = cfg["rollout_max_response_len"]  # None from v0.2.4 on when not given: unbounded
    if cfg["rollout_max_prompt_len"] is not None and response is not None:
        total = cfg["rollout_max_prompt_len"] + response
        bounds.append(
            (
                total,
                f"--rollout-max-prompt-len {cfg['rollout_max_prompt_len']} + "
                f"--rollout-max-response-len {cfg['rollout_max_response_len']}",
            )
        )
    if bounds:
        longest, longest_from = min(bounds)
    elif response is None:
        longest, longest_from = None, f"unbounded: no --rollout-max-response-len (slime {cfg.release}: no default)"
    else:
        longest, longest_from = (
            None,
            f"unbounded: response <= {response} (--rollout-max-response-len) but no prompt bound",
        )
    return Batches(
        samples_per_rollout=samples,
        global_batch=global_batch,
        global_batch_origin=global_batch_origin,
        steps_per_rollout=steps,
        steps_remainder=remainder,
        budget_tokens=budget,
        longest_sample=longest,
        longest_from=longest_from,
    )
