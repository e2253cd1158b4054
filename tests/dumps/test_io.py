"""Readers of slime v0.1.0 dumps: formats, refusal of code-executing pickles, one-line errors."""

import os
import pickle

import numpy as np
import pytest
import torch

from nanscope.dumps import demo, io, train_dump, writers
from nanscope.dumps.limits import Limits
from nanscope.errors import UserError


class MkdirOnLoad:
    """Unpickling this runs os.mkdir(path): the classic __reduce__ payload, with a visible side effect."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def test_rollout_dump_round_trip(tmp_path, make_samples):
    samples = make_samples(2, prompt=4, response=8)
    samples[1]["loss_mask"] = None  # slime fills all ones
    path = writers.write_rollout_dump(tmp_path / "3.pt", samples, rollout_id=3)
    dump = io.load(path)
    s0, s1 = list(dump.samples())
    assert (dump.kind, dump.rollout_id, dump.rank, dump.num_samples) == ("rollout", 3, None, 2)
    assert (s0.sample, s0.prompt_length, s0.response_length, s0.tokens_length) == (0, 4, 8, 12)
    assert s0.reward == 0.0 and s1.reward == 1.0
    np.testing.assert_array_equal(s0.rollout_log_probs, samples[0]["rollout_log_probs"])
    assert s1.loss_mask.tolist() == [1] * 8 and "loss_mask" not in s1.lengths
    assert s0.lengths == {"tokens": 12, "response_length": 8, "loss_mask": 8, "rollout_log_probs": 8}


def test_rollout_samples_stream_while_the_file_is_read(tmp_path, make_samples):
    path = writers.write_rollout_dump(tmp_path / "0.pt", make_samples(3, response=5000))
    dump = io.load(path)
    it = dump.samples()
    next(it)
    done, total = dump.progress()
    assert 0 < done < total / 2 and dump.rollout_id is None  # sample 0 is out; the file is a third read
    assert [s.sample for s in it] == [1, 2] and dump.num_samples == 3 and dump.rollout_id == 0


def test_reward_key_picks_from_dict_rewards(tmp_path, make_samples):
    samples = make_samples(1)
    samples[0]["reward"] = {"score": 0.5, "len": 3}
    path = writers.write_rollout_dump(tmp_path / "0.pt", samples)
    assert next(io.load(path, reward_key="score").samples()).reward == 0.5
    with pytest.raises(UserError) as e:
        next(io.load(path).samples())
    assert str(e.value) == f"{path}: reward of sample 0: a dict with keys ['len', 'score']; pass --reward-key"
    with pytest.raises(UserError, match=r"reward of sample 0: no key 'acc' \(has \['len', 'score'\]\)"):
        next(io.load(path, reward_key="acc").samples())


def test_code_executing_pickle_is_refused_and_not_run(tmp_path):
    marker = tmp_path / "marker"
    path = tmp_path / "evil.pt"
    torch.save({"rollout_id": 0, "samples": [MkdirOnLoad(str(marker))]}, path)
    with pytest.raises(UserError) as e:
        io.load(path)
    assert not marker.exists()
    assert str(e.value) == (
        f"{path}: sample 0: refused: loading it needs arbitrary unpickling (it references posix.mkdir); nanscope reads "
        "dumps with a restricted unpickler, a subset of torch.load(weights_only=True). If you trust the file, "
        "rerun with --trust-pickle"
    )
    # Only --trust-pickle runs it: the payload's return value (None) then fails the structure check.
    with pytest.raises(UserError, match=r"evil.pt: sample 0: expected a Sample.to_dict\(\) dict, got NoneType"):
        list(io.load(path, trust_pickle=True).samples())
    assert marker.is_dir()


def test_plain_pickle_is_not_a_torch_save_archive(tmp_path):
    path = tmp_path / "plain.pt"
    path.write_bytes(pickle.dumps({"samples": []}, protocol=4))
    with pytest.raises(UserError) as e:
        io.load(path)
    assert str(e.value) == f"{path}: unreadable torch.save file (not a torch.save zip archive (torch >= 1.6 format))"


@pytest.mark.parametrize("keep", [0, 10, 200, 2000])
def test_truncated_file_is_one_line(tmp_path, make_samples, keep):
    good = writers.write_rollout_dump(tmp_path / "good.pt", make_samples(4))
    bad = tmp_path / "bad.pt"
    bad.write_bytes(good.read_bytes()[:keep])
    with pytest.raises(UserError) as e:
        io.load(bad)
    assert str(e.value).startswith(f"{bad}: unreadable torch.save file (")
    assert "\n" not in str(e.value)


def test_missing_file_directory_fifo_and_size_cap(tmp_path, make_samples):
    with pytest.raises(UserError, match=r"nope.pt: dump: no such file$"):
        io.load(tmp_path / "nope.pt")
    with pytest.raises(UserError, match=r": dump: is a directory, expected a file$"):
        io.load(tmp_path)
    os.mkfifo(tmp_path / "fifo")  # opening it would block forever: refused from stat alone
    with pytest.raises(UserError, match=r"fifo: dump: not a regular file \(a FIFO\)$"):
        io.load(tmp_path / "fifo")
    with pytest.raises(UserError, match=r"^/dev/zero: dump: not a regular file \(a character device\)$"):
        io.load("/dev/zero")
    path = writers.write_rollout_dump(tmp_path / "0.pt", make_samples(2))
    with pytest.raises(UserError) as e:
        io.load(path, limits=Limits(max_bytes=100))
    assert (
        str(e.value) == f"{path}: dump: {path.stat().st_size} bytes is over the 100 bytes limit (raise it with "
        "--max-dump-mb)"
    )


@pytest.mark.parametrize(
    "obj, message",
    [
        ([1, 2], "not a slime dump: top level is list, expected a dict"),
        ({"x": 1}, "not a slime dump: expected key 'samples' (rollout dump) or 'rollout_data' (train dump), found x"),
        ({"samples": 5}, "samples: expected a list of Sample.to_dict() dicts, got int"),
        (
            {"samples": [{"tokens": [1], "reward": 1.0}]},
            "sample 0: missing field 'response_length' (not a Sample.to_dict())",
        ),
        (
            {"samples": [{"tokens": [1, 2], "response_length": "1", "reward": 1.0}]},
            "response_length of sample 0: str '1', expected an int",
        ),
        ({"samples": [{"tokens": 3, "response_length": 1, "reward": 1.0}]}, "tokens of sample 0: int, expected a list"),
        (
            {"samples": [{"tokens": [1, 2], "response_length": 1, "reward": None}]},
            "reward of sample 0: NoneType None, expected a number (slime v0.1.0 builds a float tensor from the rewards)",
        ),
        (
            {"samples": [{"tokens": [1, 2], "response_length": 2, "reward": 1.0, "loss_mask": [1, 2]}]},
            "loss_mask of sample 0: element 1 is 2, expected 0 or 1",
        ),
        (
            {"samples": [{"tokens": [1, 2], "response_length": 2, "reward": 1.0, "rollout_log_probs": [-1.0, None]}]},
            "rollout_log_probs of sample 0: element 1 is None",
        ),
        (
            {"samples": [{"tokens": [1, 2], "response_length": 2, "reward": 1.0, "rollout_log_probs": [-1.0, "x"]}]},
            "rollout_log_probs of sample 0: element 1 is str",
        ),
        (
            {"rollout_data": {"tokens": [[1]]}},
            "rollout_data: missing key 'response_lengths' (not a slime v0.1.0 train dump)",
        ),
        (
            {"rollout_data": {"tokens": [[1], [2]], "response_lengths": [1]}},
            "rollout_data['response_lengths']: 1 entries, but tokens has 2 samples",
        ),
    ],
)
def test_wrong_structure_names_field_and_sample(tmp_path, obj, message):
    path = tmp_path / "d.pt"
    torch.save(obj, path)
    with pytest.raises(UserError) as e:
        list(io.load(path).samples())
    assert str(e.value) == f"{path}: {message}"


def test_train_dump_round_trip_cp1(tmp_path):
    path = tmp_path / "train" / "4_0.pt"
    demo.write_demo(path, kind="train", rollout_id=4)
    dump = io.load(path)
    s = list(dump.samples())
    assert (dump.kind, dump.rollout_id, dump.rank, dump.num_samples, dump.cp_size) == ("train", 4, 0, 16, 1)
    assert s[5].log_probs.dtype == np.float32 and s[5].log_probs[40] == -97.0 and s[5].ref_log_probs[40] == -2.0
    assert s[7].rollout_log_probs[3] == -95.0 and s[5].positions is None
    assert s[0].lengths["total_lengths"] == 88 and s[0].lengths["advantages"] == 64


def test_train_dump_cp_positions_follow_the_zigzag(tmp_path):
    # total 10, response 6, cp 2: chunk 3; CP rank 1 holds positions 3-5 and 6-8, i.e. logits 3..8 ->
    # response tokens 0..5 (layout.segments' docstring example); CP rank 0 holds no response logit.
    data = {
        "tokens": [torch.arange(10)],
        "response_lengths": [6],
        "loss_masks": [torch.ones(6, dtype=torch.int)],
        "log_probs": [torch.zeros(6)],
    }
    writers.write_train_dump(tmp_path / "r1.pt", data, rank=1)
    s = next(io.load(tmp_path / "r1.pt", cp_size=2, tp_size=1).samples())
    assert s.positions.tolist() == [0, 1, 2, 3, 4, 5]
    # rank 4 with tp 4: cp rank (4 // 4) % 2 = 1 as well; rank 2 with tp 4: cp rank 0 -> no entries.
    writers.write_train_dump(tmp_path / "r4.pt", data, rank=4)
    assert next(io.load(tmp_path / "r4.pt", cp_size=2, tp_size=4).samples()).positions.tolist() == [0, 1, 2, 3, 4, 5]
    writers.write_train_dump(tmp_path / "r2.pt", data, rank=2)
    assert next(io.load(tmp_path / "r2.pt", cp_size=2, tp_size=4).samples()).positions.tolist() == []


def test_cp_response_positions_split_response(tmp_path):
    # total 20, response 12, prompt 8, cp 2: chunk 5. Logits of the response: positions 7..18.
    # rank 0: chunks [0,5) and [15,20) -> logits 15..18 -> response 8..11.
    # rank 1: chunks [5,10) and [10,15) -> logits 7..9 and 10..14 -> response 0..2 and 3..7.
    assert train_dump.cp_response_positions(20, 12, 2, 0).tolist() == [8, 9, 10, 11]
    assert train_dump.cp_response_positions(20, 12, 2, 1).tolist() == [0, 1, 2, 3, 4, 5, 6, 7]


def test_shared_sample_dict_and_strided_tensor_are_refused(tmp_path):
    s = {"tokens": [1, 2, 3], "response_length": 2, "reward": 1.0}
    torch.save({"rollout_id": 0, "samples": [s, dict(s), s]}, tmp_path / "r.pt")
    with pytest.raises(UserError) as e:
        list(io.load(tmp_path / "r.pt").samples())
    assert str(e.value) == (
        f"{tmp_path / 'r.pt'}: sample 2: the same object as sample 0 (a shared reference, not "
        "slime's one dict per sample)"
    )
    data = {"tokens": [torch.arange(8)], "response_lengths": [2], "log_probs": [torch.zeros(4)[::2]]}
    writers.write_train_dump(tmp_path / "t.pt", data)
    with pytest.raises(UserError) as e:
        list(io.load(tmp_path / "t.pt").samples())
    assert str(e.value) == (
        f"{tmp_path / 't.pt'}: log_probs of sample 0: tensor of 2 elements with stride 2 over "
        "a storage of 4, expected a contiguous one"
    )


def test_error_lines_show_types_not_containers(tmp_path):
    # A 10^6-entry list, a 10^6-character string, a 2^1100 int: the line shows a type or a short repr.
    torch.save({"samples": [{"tokens": [1], "response_length": 1, "reward": 2**1100}]}, tmp_path / "a.pt")
    with pytest.raises(UserError, match=r"reward of sample 0: int of 1101 bits, too large for the float tensor"):
        list(io.load(tmp_path / "a.pt").samples())
    torch.save({"samples": [{"tokens": [1], "response_length": "7" * 10**6, "reward": 1.0}]}, tmp_path / "s.pt")
    with pytest.raises(UserError, match=r"response_length of sample 0: str '7{39}, expected an int$"):
        list(io.load(tmp_path / "s.pt").samples())
    torch.save({"samples": [{"tokens": [1], "response_length": 1, "reward": [0.5] * 10**6}]}, tmp_path / "b.pt")
    with pytest.raises(UserError, match=r"reward of sample 0: list, expected a number \(slime"):
        list(io.load(tmp_path / "b.pt").samples())
    torch.save(
        {"samples": [{"tokens": [1], "response_length": 1, "reward": {2**70: 1.0, 7: 2.0, "s": 0}}]}, tmp_path / "c.pt"
    )
    with pytest.raises(UserError, match=r"reward of sample 0: a dict with keys \['7', '<int>', 's'\]; pass"):
        list(io.load(tmp_path / "c.pt").samples())


def test_load_rollout_reads_slime_dumps_and_refuses_others(tmp_path):
    path = tmp_path / "3.pt"
    torch.save({"rollout_id": 3, "samples": [{"tokens": [5, 6, 7], "response_length": 2, "loss_mask": None}]}, path)
    (s,) = io.load_rollout(str(path))
    assert s["tokens"].tolist() == [5, 6, 7] and s["response_length"] == 2 and s["loss_mask"].tolist() == [1.0, 1.0]
    torch.save({"rollout_id": 3}, tmp_path / "bad.pt")
    with pytest.raises(ValueError, match=r"bad.pt: not a slime rollout dump \(expected a dict with a list 'samples'\)"):
        io.load_rollout(str(tmp_path / "bad.pt"))
    with pytest.raises(ValueError, match=r"none.pt: cannot read the rollout dump: FileNotFoundError"):
        io.load_rollout(str(tmp_path / "none.pt"))
