"""Hostile dumps are refused cheaply: one stderr line naming file, sample and field, exit 2, no traceback.

Every case runs `nanscope scan` in its own process under RLIMIT_AS (what its imports mapped plus 1.375 GiB: 2 GiB
with a CPU build of torch) and a wall-clock alarm
(`tests.dumps.hostile.isolated`): a reader that allocates what a file only declares (931 GiB for a
response_length of 10^12, 37 GiB for a stride-0 view, 4.8 GB of sets from 20 MB of EMPTY_SET opcodes) dies
of the limit or the alarm instead of passing, and each case's peak RSS is measured.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nanscope.dumps.limits import MAX_SAMPLE_TOKENS
from nanscope.trace.loading import pickle_budget
from tests.address_space import CAP
from tests.dumps.hostile import (
    CASE_BUDGET,
    PLACEHOLDER,
    isolated,
    nested_dict,
    nested_list,
    rollout,
    torch_zip,
    train,
    with_raw,
)


def scan_isolated(cases: list[list[str]]) -> list[dict]:
    """Run `nanscope scan ARGV` for each case in its own forked process under the limits of `isolated`."""
    return isolated([["scan", "--no-progress", *argv] for argv in cases])


def outside(name: str) -> str:
    """The refusal of a global torch's weights_only allowlist has and nanscope's subset leaves out."""
    full = name if name.startswith("torch.") else f"torch._utils.{name}"
    return (
        f"{full} is in torch's weights_only allowlist but not in nanscope's subset of it (a scan reads plain "
        "dense tensors: no meta, sparse, quantized or nested ones); nanscope reads dumps with a restricted "
        "unpickler, a subset of torch.load(weights_only=True). If you trust the file, rerun with --trust-pickle"
    )


def assert_refused(results: list[dict], expected: list[str]) -> None:
    """Each result: exit 2 and exactly the expected one line (`nanscope scan: error: ` + text)."""
    for res, want in zip(results, expected, strict=True):
        assert (res["rc"], res["stderr"]) == (2, f"nanscope scan: error: {want}\n"), res


def test_handwritten_hostile_dumps_are_one_line_each(tmp_path):
    cap = f"{MAX_SAMPLE_TOKENS:,}"
    p = {
        name: str(tmp_path / f"{name}.pt")
        for name in (
            "resp",
            "resp_tensor",
            "stride0",
            "meta",
            "sparse",
            "deep_reward",
            "deep_mask",
            "deep_logp",
            "deep_dict",
        )
    }
    torch.save(rollout({"response_length": 10**12, "loss_mask": None}), p["resp"])
    torch.save(train(response_lengths=[torch.tensor(10**12)]), p["resp_tensor"])
    torch.save(train(log_probs=[torch.zeros(1).expand(10**10)]), p["stride0"])  # 1.5 KB file
    torch.save(train(tokens=[torch.empty(10**12, dtype=torch.long, device="meta")]), p["meta"])
    torch.save(train(loss_masks=[sparse(10**12)]), p["sparse"])
    with_raw(p["deep_reward"], rollout({"reward": PLACEHOLDER}), nested_list(100_000))
    with_raw(p["deep_mask"], rollout({"loss_mask": PLACEHOLDER}), nested_list(100_000))
    with_raw(p["deep_logp"], rollout({"rollout_log_probs": PLACEHOLDER}), nested_list(100_000))
    with_raw(p["deep_dict"], rollout({"reward": PLACEHOLDER}), nested_dict(100_000))
    os.mkfifo(tmp_path / "fifo")
    big = tmp_path / "big.pt"
    torch.save(train(log_probs=[torch.zeros(300_000)]), big)  # 1.1 MiB
    cases = [
        [p["resp"]],
        [p["resp_tensor"]],
        [p["stride0"]],
        [p["meta"]],
        [p["sparse"]],
        [p["deep_reward"]],
        [p["deep_mask"]],
        [p["deep_logp"]],
        [p["deep_dict"]],
        [p["deep_dict"], "--reward-key", "a"],
        [str(tmp_path / "fifo")],
        ["/dev/zero"],
        [str(big), "--max-dump-mb", "1"],
    ]
    assert_refused(
        scan_isolated(cases),
        [
            f"{p['resp']}: response_length of sample 0: 1,000,000,000,000 tokens declared, over the per-sample cap "
            f"of {cap} (raise it with --max-sample-tokens)",
            f"{p['resp_tensor']}: response_lengths of sample 0: 1,000,000,000,000 tokens declared, over the per-sample "
            f"cap of {cap} (raise it with --max-sample-tokens)",
            f"{p['stride0']}: log_probs of sample 0: tensor of 10,000,000,000 elements with stride 0 over a storage "
            "of 1, expected a contiguous one",
            f"{p['meta']}: tokens of sample 0: refused: {outside('torch._utils._rebuild_meta_tensor_no_storage')}",
            f"{p['sparse']}: loss_masks of sample 0: refused: {outside('torch._utils._rebuild_sparse_tensor')}",
            f"{p['deep_reward']}: reward of sample 0: list, expected a number (slime v0.1.0 builds a float tensor "
            "from the rewards)",
            f"{p['deep_mask']}: loss_mask of sample 0: not a flat list of 0/1",
            f"{p['deep_logp']}: rollout_log_probs of sample 0: element 0 is list",
            f"{p['deep_dict']}: reward of sample 0: a dict with keys ['a']; pass --reward-key",
            f"{p['deep_dict']}: reward of sample 0: dict, expected a number (slime v0.1.0 builds a float tensor "
            "from the rewards)",
            f"{tmp_path / 'fifo'}: dump: not a regular file (a FIFO)",
            "/dev/zero: dump: not a regular file (a character device)",
            f"{big}: dump: {big.stat().st_size / 2**20:.1f} MiB is over the 1.0 MiB limit (raise it with --max-dump-mb)",
        ],
    )


def test_the_harness_catches_an_allocation():
    """The limit is real: a scan that allocates 931 GiB dies inside its case instead of passing."""
    code = "import numpy as np; np.ones(10**12, np.int8)"
    res = subprocess.run(
        [
            sys.executable,
            "-c",
            f"{CAP}\nimport numpy as np\ncap({CASE_BUDGET})\n{code}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 1 and "MemoryError" in res.stderr


def sparse(n: int) -> torch.Tensor:
    """A 1-D sparse tensor declaring n elements, two of them stored."""
    return torch.sparse_coo_tensor(torch.tensor([[0, n - 1]]), torch.ones(2), (n,), check_invariants=False)


TOKEN_FIELDS = ("tokens", "loss_masks", "log_probs", "ref_log_probs", "rollout_log_probs", "advantages")
DTYPES = (torch.float32, torch.bfloat16, torch.int64, torch.int32)


def _declared_length(d, path: Path) -> tuple[list[str], str]:
    n = d.draw(st.integers(MAX_SAMPLE_TOKENS + 1, 2**62), "declared length")
    as_tensor = d.draw(st.booleans(), "as a 0-d tensor")
    value = torch.tensor(n) if as_tensor else n
    if d.draw(st.booleans(), "rollout dump"):
        torch.save(rollout({"response_length": value, "loss_mask": None}), path)
        field = "response_length"
    else:
        torch.save(train(response_lengths=[value]), path)
        field = "response_lengths"
    return [str(path)], (
        f"{path}: {field} of sample 0: {n:,} tokens declared, over the per-sample cap of "
        f"{MAX_SAMPLE_TOKENS:,} (raise it with --max-sample-tokens)"
    )


def _expanded_tensor(d, path: Path) -> tuple[list[str], str]:
    n = d.draw(st.integers(2, 10**12), "elements")
    field, dtype = d.draw(st.sampled_from(TOKEN_FIELDS), "field"), d.draw(st.sampled_from(DTYPES), "dtype")
    torch.save(train(**{field: [torch.zeros(1, dtype=dtype).expand(n)]}), path)
    return [str(path)], (
        f"{path}: {field} of sample 0: tensor of {n:,} elements with stride 0 over a storage "
        "of 1, expected a contiguous one"
    )


def _meta_or_sparse(d, path: Path) -> tuple[list[str], str]:
    n = d.draw(st.integers(1, 10**12), "size")
    field = d.draw(st.sampled_from(TOKEN_FIELDS), "field")
    if d.draw(st.booleans(), "meta"):
        torch.save(train(**{field: [torch.empty(n, dtype=d.draw(st.sampled_from(DTYPES)), device="meta")]}), path)
        return [str(path)], f"{path}: {field} of sample 0: refused: {outside('_rebuild_meta_tensor_no_storage')}"
    torch.save(train(**{field: [sparse(max(n, 2))]}), path)
    return [str(path)], f"{path}: {field} of sample 0: refused: {outside('_rebuild_sparse_tensor')}"


def _nesting(d, path: Path) -> tuple[list[str], str]:
    depth = d.draw(st.integers(2_000, 200_000), "depth")
    field = d.draw(st.sampled_from(("reward", "loss_mask", "rollout_log_probs", "response_length")), "field")
    if d.draw(st.booleans(), "dict") and field == "reward":
        with_raw(path, rollout({"reward": PLACEHOLDER}), nested_dict(depth))
        return [str(path), "--reward-key", "a"], (
            f"{path}: reward of sample 0: dict, expected a number (slime v0.1.0 builds a float tensor from the rewards)"
        )
    with_raw(path, rollout({field: PLACEHOLDER}), nested_list(depth))
    return [str(path)], f"{path}: {field} of sample 0: " + {
        "reward": "list, expected a number (slime v0.1.0 builds a float tensor from the rewards)",
        "loss_mask": "not a flat list of 0/1",
        "rollout_log_probs": "element 0 is list",
        "response_length": "list, expected an int",
    }[field]


@pytest.mark.slow  # CI's slow tier: the fast tier keeps its 4 minutes on 2 cores
@settings(max_examples=1, deadline=None, suppress_health_check=list(HealthCheck))
@given(d=st.data())
def test_generated_hostile_dumps_are_one_line_each(d):
    """Three cases of each class, drawn at random, run as one batch of isolated scans."""
    with tempfile.TemporaryDirectory() as tmp:
        cases, expected = [], []
        for k, make in enumerate([_declared_length, _expanded_tensor, _meta_or_sparse, _nesting] * 3):
            argv, line = make(d, Path(tmp) / f"{k}.pt")
            cases.append(argv)
            expected.append(line)
        assert_refused(scan_isolated(cases), expected)


@pytest.mark.slow  # CI's slow tier: the fast tier keeps its 4 minutes on 2 cores
def test_a_list_shared_by_every_sample_is_refused_past_the_budget(tmp_path):
    """4,000 samples naming one 10,000-entry list: 40M entries to convert from a file of ~0.2 MB."""
    cases = []
    for field, shared in (("loss_mask", [1] * 10_000), ("rollout_log_probs", [0.0] * 10_000)):
        tokens = [1] * 10_001
        samples = [{"tokens": tokens, "response_length": 10_000, "reward": 1.0, field: shared} for _ in range(4_000)]
        torch.save({"rollout_id": 0, "samples": samples}, tmp_path / f"{field}.pt")
        cases.append((field, tmp_path / f"{field}.pt"))
    for (field, path), res in zip(cases, scan_isolated([[str(p)] for _, p in cases])):
        size = path.stat().st_size
        assert res["rc"] == 2 and res["stderr"].count("\n") == 1, res
        assert res["stderr"].startswith(f"nanscope scan: error: {path}: {field} of sample ")
        assert res["stderr"].endswith(
            f"the samples so far need more entries than the file's {size:,} bytes can "
            "hold (lists or tensors shared between samples); refusing to expand them\n"
        )


FLOODS = {
    "EMPTY_SET": b"\x8f",
    "EMPTY_LIST": b"]",
    "EMPTY_DICT": b"}",
    "MARK": b"(",
}  # 216-, 120-, 64-, 72-byte objects


def flood_line(path: Path, op: bytes, table: list[int]) -> str:
    """The refusal of a file holding PROTO 2 then one opcode repeated, charged `table[op]` each."""
    size = path.stat().st_size
    budget = pickle_budget.budget(size)
    at = 2 + budget // table[op[0]]  # the first opcode whose charge passes the budget
    return (
        f"{path}: its pickle builds over {budget:,} bytes of objects by byte {at:,} of data.pkl, the budget of a "
        f"{size:,}-byte file (8 bytes a byte + 32 MiB); refusing it"
    )


@pytest.mark.slow  # CI's slow tier: the fast tier keeps its 4 minutes on 2 cores
def test_opcode_floods_are_refused_within_their_budget(tmp_path):
    """20 MB of one allocating opcode built 1.7-4.8 GB of objects before issue 24 (here it dies of the 2 GiB
    limit); now the restricted unpickler refuses each at its budget, 8 bytes a byte + 32 MiB (201 MB), and
    the case's peak RSS grows by at most that, plus the pickle's own bytes, plus 32 MiB (what reading the
    archive and the fork's copy-on-write add: 20-25 MiB measured)."""
    paths = {}
    for name, op in FLOODS.items():
        paths[name] = torch_zip(tmp_path / f"{name}.pt", b"\x80\x02" + op * (20 << 20) + b".")
    results = scan_isolated([[str(p)] for p in paths.values()])
    for (name, path), res in zip(paths.items(), results, strict=True):
        line = flood_line(path, FLOODS[name], pickle_budget.charges())
        assert (res["rc"], res["stderr"]) == (2, f"nanscope scan: error: {line}\n"), (name, res)
        size = path.stat().st_size
        assert res["grew"] < pickle_budget.budget(size) + size + 32 * 2**20, (name, res["grew"] / 2**20)


@pytest.mark.slow  # CI's slow tier: the fast tier keeps its 4 minutes on 2 cores
def test_one_run_of_millions_of_ints_stays_small(tmp_path):
    """One APPENDS of 8M mixed int opcodes (20 MB): before issue 24 the run's regex kept state for every
    opcode (57 bytes a byte) and the C unpickler a Python list of every int: 1.0 GB of RSS. Now the run is
    matched possessively and decoded 65,536 at a time: the int32 arrays (1.6 bytes a byte) and the pickle."""
    path = torch_zip(tmp_path / "ints.pt", b"\x80\x02](" + b"K\x01M\x00\x10" * (4 << 20) + b"e.")
    (res,) = scan_isolated([[str(path)]])
    assert (res["rc"], res["stderr"]) == (
        2,
        f"nanscope scan: error: {path}: not a slime dump: top level is list, expected a dict\n",
    ), res
    assert res["grew"] < 3 * path.stat().st_size + 32 * 2**20, res["grew"] / 2**20
