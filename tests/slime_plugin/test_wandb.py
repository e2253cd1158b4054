"""The plugin's logging path through real wandb, offline: the nanscope/* series and the alerts, read back from
the run's own `.wandb` file, and a failure to log that is one warning line.

wandb 0.31 ships no Python reader for its run file (wandb-core, in Go, writes and syncs it; the Python
`wandb.sdk.internal.datastore` is gone), so `records` below reads its framing, which is LevelDB's log format
with wandb's header (the format the old datastore documented: a 7-byte header `:W&B`, 0xBEE1, version 0; 32 KiB
blocks of chunks, each `crc32(type, data)` uint32, length uint16, type uint8 FULL/FIRST/MIDDLE/LAST), and
parses each record with wandb's own protobuf, `wandb.proto.wandb_internal_pb2.Record`.
"""

import datetime
import json
import struct
import sys
import time
import types
import zlib
from pathlib import Path
from types import SimpleNamespace

import pytest

from nanscope.slime_plugin import logs
from nanscope.slime_plugin.settings import Settings

wandb = pytest.importorskip("wandb")  # the `logging` extra (and so the `test` extra)

from wandb.proto import wandb_internal_pb2  # noqa: E402

# 64 x 8 samples per rollout, 256 per optimizer step: 2 steps a rollout, train/step = 2 x rollout_id + step_id
ARGS = dict(rollout_batch_size=64, n_samples_per_prompt=8, global_batch_size=256)
HEALTHY = {
    "nanscope/max_kl_log_ratio": 0.5,
    "nanscope/max_ppo_log_ratio": 0.25,
    "nanscope/max_tis_log_ratio": None,  # not measured (no --use-tis): not logged
    "nanscope/train_rollout_gap_mean": 0.125,
    "nanscope/train_rollout_gap_p99": 0.75,
    "nanscope/train_rollout_gap_max": 1.5,
    "nanscope/clamped_tokens": 0,
    "nanscope/nonfinite_inputs": 0,
}
# (rollout_id, step_id, metrics): the third step's KL log-ratio is past 60, within 17.2 of fp32's overflow
STEPS = [
    (0, 0, HEALTHY),
    (0, 1, {**HEALTHY, "nanscope/max_kl_log_ratio": 21.0, "nanscope/clamped_tokens": 3}),
    (1, 0, {**HEALTHY, "nanscope/max_kl_log_ratio": 71.5, "nanscope/clamped_tokens": 9}),
]
PLACE = {"rank": 1, "microbatch": 0, "sample": 5}

_BLOCK, _HEADER = 32768, 7
WAIT_S = 60  # wandb-core's writes after wandb.finish(): a bound on a loaded box, not a speed
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def records(path: Path) -> list:
    """Every complete Record in a `.wandb` run file, in order; a chunk still being written at the end (wandb-core
    writes in its own process) is not one yet."""
    data = path.read_bytes()
    assert struct.unpack("<4sHB", data[:_HEADER]) == (b":W&B", 0xBEE1, 0), data[:_HEADER]
    out, pending, at = [], None, _HEADER
    while at + _HEADER <= len(data):
        if _BLOCK - at % _BLOCK < _HEADER:  # a block's tail too short for a chunk header: zero padding
            at += _BLOCK - at % _BLOCK
            continue
        crc, length, kind = struct.unpack("<IHB", data[at : at + _HEADER])
        chunk = data[at + _HEADER : at + _HEADER + length]
        if len(chunk) < length:  # the writer's last chunk, not all there yet
            break
        at += _HEADER + length
        if kind == 0 and length == 0:  # preallocated zeros at the end
            continue
        assert crc == zlib.crc32(chunk, zlib.crc32(bytes([kind]))), f"bad checksum at byte {at}"
        pending = chunk if kind in (_FULL, _FIRST) else pending + chunk
        if kind in (_FULL, _LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            out.append(record)
    return out


def finished_records(root: Path, timeout_s: float = WAIT_S) -> list:
    """The records of the one offline run under `root`, once wandb-core has written its `exit` record: wandb.finish()
    returns before its service has written everything (on a loaded box the file held no history yet). A bound, not
    a speed: past it, the test fails saying what the file held."""
    deadline, recs = time.monotonic() + timeout_s, []
    while True:
        found = list(root.glob("wandb/offline-run-*/run-*.wandb"))
        if len(found) == 1 and len(found[0].read_bytes()) >= _HEADER:
            recs = records(found[0])
            if recs and recs[-1].WhichOneof("record_type") == "exit":
                return recs
        if time.monotonic() > deadline:
            kinds = [r.WhichOneof("record_type") for r in recs]
            pytest.fail(f"wandb wrote no exit record within {timeout_s:g} s under {root}: run files {found}, {kinds}")
        time.sleep(0.1)


def history(recs) -> list[dict]:
    """Each wandb.log call's row, as logged: {key: value}, wandb's own _step/_runtime/_timestamp left out."""
    rows = []
    for r in recs:
        if r.WhichOneof("record_type") == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
            rows.append({k: v for k, v in row.items() if not k.startswith("_")})
    return rows


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """wandb offline with every file it writes under tmp_path, no network, no git, no console capture."""
    env = {
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(tmp_path),
        "WANDB_CACHE_DIR": str(tmp_path / "cache"),  # wandb-core's debug log, else in ~/.cache/wandb
        "WANDB_CONFIG_DIR": str(tmp_path / "config"),
        "WANDB_DATA_DIR": str(tmp_path / "data"),
        "WANDB_SILENT": "true",
        "WANDB_DISABLE_GIT": "true",
        "WANDB_DISABLE_CODE": "true",
        "WANDB_CONSOLE": "off",
        "WANDB_API_KEY": "",
        "WANDB_PROJECT": "nanscope-test",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    yield tmp_path
    if wandb.run is not None:
        wandb.finish()
    wandb.teardown()  # stops the wandb-core service this test started


@pytest.mark.slow  # CI's slow tier: the fast tier keeps its 4 minutes on 2 cores
def test_the_series_every_step_at_train_step(offline, capsys):
    wandb.init(settings=wandb.Settings(x_disable_stats=True, x_disable_meta=True))
    logger = logs.Logger(Settings(), metrics_logger=None, logs=True)  # v0.1.0: the plugin calls wandb.log
    args = SimpleNamespace(use_wandb=True, **ARGS)
    for rollout_id, step_id, metrics in STEPS:
        logger.step(args, {"rollout_id": rollout_id, "step_id": step_id}, metrics, {"nanscope/max_kl_log_ratio": PLACE})
    wandb.finish()

    recs = finished_records(offline)
    expected = [
        {**{k: v for k, v in m.items() if v is not None}, "train/step": 2 * r + s} for r, s, m in STEPS
    ]  # every step, every measured metric, the exact values
    assert history(recs) == expected
    metrics = [r.metric for r in recs if r.WhichOneof("record_type") == "metric"]
    assert [(m.glob_name, m.step_metric) for m in metrics] == [("nanscope/*", "train/step")]  # defined once

    # the warnings: the second step's KL past 20, the third's past 60, one line each; and a wandb.alert each
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "nanscope: warning: rollout 0 step 1: nanscope/max_kl_log_ratio = 21 > 20 (the plugin's loss clamps "
        "log-ratios at ±20) (KL log-ratio ref - logp), at rank 1, micro-batch 0, sample 5",
        "nanscope: warning: rollout 1 step 0: nanscope/max_kl_log_ratio = 71.5 > 60: within 17.2 of fp32's exp "
        "overflow at 88.72 (KL log-ratio ref - logp), at rank 1, micro-batch 0, sample 5",
    ]
    alerts = [r.alert for r in recs if r.WhichOneof("record_type") == "alert"]
    titles = [
        "nanscope: nanscope/max_kl_log_ratio > 20",
        "nanscope: nanscope/max_kl_log_ratio > 60",
    ]  # one per threshold
    assert [(a.title, a.text, a.level, a.wait_duration) for a in alerts] == [
        (title, line.split(": ", 3)[3], "INFO", 10 * 60 * 1000) for title, line in zip(titles, lines)
    ]  # offline, wandb records every alert; wait_duration (ms) is the rate limit the server applies per title
    assert logs.ALERT_EVERY == datetime.timedelta(minutes=10)


def test_wandb_before_init_is_one_warning_line_and_the_run_goes_on(offline, capsys):
    assert wandb.run is None  # wandb raises wandb.Error: "You must call wandb.init() before wandb.define_metric()"
    logger = logs.Logger(Settings(), metrics_logger=None, logs=True)
    args = SimpleNamespace(use_wandb=True, **ARGS)
    for step_id in (0, 1):
        logger.step(args, {"rollout_id": 0, "step_id": step_id}, HEALTHY, {})
    lines = capsys.readouterr().out.splitlines()
    shown = sorted(k for k, v in HEALTHY.items() if v is not None)
    refused = "Error: You must call wandb.init() before wandb.define_metric()"
    assert lines == [f"nanscope: warning: could not log {shown}: {refused}"] * 2
    assert [row["step_id"] for row in logger.logged] == [0, 1]  # both steps went on

    # a crossing step: its warning, then one line for the alert wandb refused and one for the log
    logger.step(args, {"rollout_id": 0, "step_id": 2}, {"nanscope/max_ppo_log_ratio": 25.0}, {})
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[:3] for line in lines] == [
        ["nanscope", " warning", " rollout 0 step 2"],
        ["nanscope", " warning", " could not send a wandb alert"],
        ["nanscope", " warning", " could not log ['nanscope/max_ppo_log_ratio']"],
    ], lines


def test_a_logger_that_raises_is_one_warning_line(monkeypatch, capsys):
    release = types.ModuleType("release_logging")

    def log(args, metrics, step_key):
        raise OSError("disk full")

    release.log = log
    monkeypatch.setitem(sys.modules, "release_logging", release)
    logger = logs.Logger(Settings(), metrics_logger="release_logging.log", logs=True)
    args = SimpleNamespace(use_wandb=False, **ARGS)
    for step_id in (0, 1):
        logger.step(args, {"rollout_id": 3, "step_id": step_id}, {"nanscope/clamped_tokens": 0}, {})
    assert (
        capsys.readouterr().out.splitlines()
        == ["nanscope: warning: could not log ['nanscope/clamped_tokens']: OSError: disk full"] * 2
    )
