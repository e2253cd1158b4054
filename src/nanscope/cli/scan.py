"""`nanscope scan`: find the samples and tokens of a slime dump that make its loss non-finite."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from pathlib import Path

from nanscope import case
from nanscope.cli import help, numbers, progress, scan_demo, terminal
from nanscope.dumps import many, ray_scan
from nanscope.dumps.flags import ScanFlags
from nanscope.dumps.limits import MAX_DUMP_MB, MAX_SAMPLE_TOKENS, Limits
from nanscope.errors import UserError
from nanscope.facts import releases
from nanscope.inputs import MiB, printable, skipped_lines
from nanscope.launch import words
from nanscope.megatron import proctree, ray_session
from nanscope.report import files

DESCRIPTION = """\
Scan a slime debug dump for NaN hazards and name the sample, token and mechanism of each.

Reads the dump formats of slime v0.1.0, v0.2.4, v0.3.1 and main, told apart by the file's fields (the
report's `format` line and JSON key say which, and which fields differ from v0.1.0's): rollout dumps'
Sample gained fields in v0.2.4 and v0.3.1; train dumps hold rollout_log_probs as bf16 in v0.1.0 and
fp32 from v0.2.4 (the checks use the same dtype), v0.3.1 adds rollout ids and mask sums, and main
writes one dict per sample (format_version 2). The checks are the same on each.

Reads rollout dumps (--save-debug-rollout-data: {rollout_id}.pt) and train dumps
(--save-debug-train-data: {rollout_id}_{rank}.pt) with a restricted unpickler that accepts a subset of
what torch.load(weights_only=True) accepts (and reads a case-sized rollout dump in seconds, not
minutes); a file that needs more is refused unless you pass --trust-pickle. slime writes a train dump
after the optimizer step, so the step that crashes leaves none: scan that step's rollout dump.

Given a directory, scans every *.pt file under it, several at a time on the available cores, and
prints one line per file, a summary (--json writes them) and the trend's first hazard in one line. Its
--html and --json hold the whole trend: per rollout, the largest log-ratios that reach an exp (train
dumps: exact KL and TIS, the PPO bound; rollout dumps: the bound -rollout_log_probs) and the train-rollout
gap, against fp32's 88.72, and the rollout where a hazard first appears (a rollout's train dump is written after its training, so the
failing rollout has only its rollout dump). A file's rollout is the rollout_id it stores, else the one its
name gives ({rollout_id}.pt, {rollout_id}_{rank}.pt); one line names the files where the two disagree.

Positions are 0-based: `sample` in the file, `token` in the response, `abs_token` in the sequence
(prompt + response). Masked tokens (loss_mask 0) are hazards too: slime v0.1.0 computes exp on them
and masks afterwards by multiplication. Rollout dumps have only rollout_log_probs, so their log-ratio
checks are bounds ("possibly"); train dumps give exact KL and TIS log-ratios.

The slime flags below decide what is a hazard; defaults are the slime-795 case's values.

exit status: 0 no hazard, 1 hazards found, 2 unreadable, refused or malformed input
(including lengths slime v0.1.0 would assert on).
"""

EPILOG = """\
examples:
  nanscope scan --write-demo rollout_data/12.pt     # a small dump with planted hazards
  nanscope scan rollout_data/12.pt
  nanscope scan rollout_data/12.pt --json scan.json --html scan.html
  nanscope scan train_data/12_50.pt --context-parallel-size 2 --tensor-model-parallel-size 4
  nanscope scan rollout_data/12.pt --n-samples-per-prompt 4 --reward-key score --no-use-tis
  nanscope scan /root/dumps/ --json scan.json        # every dump under the directory
  nanscope scan /root/dumps/ --html trend.html       # and the run's trend towards 88.72, per rollout
  nanscope scan --write-demo train_data/12.pt --demo-kind train --demo-release main   # main's train format
  nanscope scan --write-demo run/ --demo-kind run    # a drifting run: 6 rollouts, the KL log-ratio 0, 18, .. 90
  nanscope scan run/ --html trend.html               # its trend, past 88.72 at rollout 5
  nanscope scan /root/dumps/ --ray --ray-address head:6379   # one Ray task a file, each read where it lies
"""


def add_parser(sub):
    parser = sub.add_parser(
        "scan",
        help="find the sample/token of every NaN hazard in a slime dump",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=help.Formatter,
    )
    parser.add_argument(
        "dump",
        nargs="?",
        help="a rollout dump {rollout_id}.pt, a train dump {rollout_id}_{rank}.pt, or a directory of them",
    )
    _add_output_arguments(parser.add_argument_group("output"))
    _add_input_arguments(parser.add_argument_group("input"))
    _add_slime_flags(parser.add_argument_group("slime flags (defaults: the slime-795 case)"))
    return parser


def _add_output_arguments(group) -> None:
    """What the scan writes: JSON, HTML, the terminal table, the progress bar; workers for a directory."""
    group.add_argument("--json", metavar="PATH", help="write hazards and summary as JSON")
    group.add_argument(
        "--html",
        metavar="PATH",
        help="write an HTML report: one dump's log-ratio and hazard-map plots, or a directory's trend "
        "(per-rollout log-ratio maxima, the 88.72 line, the first hazard)",
    )
    group.add_argument(
        "--max-rows",
        type=numbers.ROWS,
        default=30,
        help="hazard rows in the terminal table (default 30; 0: none, the counts only)",
    )
    group.add_argument(
        "--max-per-sample",
        type=numbers.COUNT,
        default=100,
        help="hazards listed per check and sample in JSON/HTML; counts stay exact (default 100)",
    )
    group.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar with tokens/s on stderr (default: when stderr is a terminal); --no-progress: no bar, "
        "and a directory's scan prints no line a file either",
    )
    group.add_argument(
        "--quiet",
        action="store_true",
        help="no progress on stderr (default: a directory's scan prints one line a file, under the bar on a terminal)",
    )
    group.add_argument(
        "--workers",
        type=numbers.WORKERS,
        default=None,
        metavar="N",
        help="directories: files scanned at once, >= 1 (default: the cores available; with --ray, as Ray schedules)",
    )
    group.add_argument(
        "--ray",
        action="store_true",
        help="directories: scan each file as a Ray task, reading it where it lies (a local Ray instance, or "
        "--ray-address's cluster, whose nodes must see the files); the same output; needs the nanscope[ray] extra",
    )
    group.add_argument(
        "--ray-address",
        metavar="ADDRESS",
        help="with --ray: join this Ray cluster (default: a local instance, removed after the scan)",
    )
    group.add_argument(
        "--ray-timeout",
        type=numbers.SECONDS,
        metavar="S",
        help=f"with --ray-address: give up joining the cluster after S seconds, one line, exit 2 (default "
        f"{ray_session.TIMEOUT_S:g})",
    )


def _add_input_arguments(group) -> None:
    """How the dump is read (trust, parallel sizes, caps), and the demo dump --write-demo writes."""
    group.add_argument(
        "--trust-pickle",
        action="store_true",
        help="allow arbitrary unpickling (torch.load(weights_only=False)): runs code from the file",
    )
    group.add_argument(
        "--context-parallel-size",
        type=numbers.PARALLEL,
        default=1,
        metavar="N",
        help="train dumps: the run's CP size; per-token tensors are CP-sliced when > 1 (default 1)",
    )
    group.add_argument(
        "--tensor-model-parallel-size",
        type=numbers.PARALLEL,
        default=1,
        metavar="N",
        help="train dumps with CP: the run's TP size, to find the CP rank of the dump's rank "
        "as (rank // tp) %% cp, Megatron's default order tp-cp-ep-dp-pp (default 1)",
    )
    group.add_argument(
        "--max-dump-mb",
        type=numbers.DUMP_MB,
        default=MAX_DUMP_MB,
        metavar="MB",
        help=f"refuse dump files larger than this (default {MAX_DUMP_MB})",
    )
    group.add_argument(
        "--max-sample-tokens",
        type=numbers.TOKENS,
        default=MAX_SAMPLE_TOKENS,
        metavar="N",
        help="refuse a sample whose fields hold, or whose response_length declares, more entries "
        f"(default {MAX_SAMPLE_TOKENS:,})",
    )
    group.add_argument(
        "--write-demo",
        metavar="PATH",
        help="write a small dump with planted hazards and exit; its rollout_id is the one PATH's name gives "
        "({id}.pt, {id}_{rank}.pt), else the demo's own (printed); with --demo-kind run, PATH is a directory",
    )
    group.add_argument("--force", action="store_true", help="with --write-demo: replace existing files")
    group.add_argument(
        "--demo-kind",
        choices=("rollout", "train", "run"),
        default="rollout",
        help="what --write-demo writes (default rollout): one rollout dump, one train dump, or run: a drifting run "
        "of several rollouts (PATH/rollout_data/{id}.pt, PATH/train_data/{id}_0.pt) whose log-ratio maxima cross "
        "88.72 at the last",
    )
    group.add_argument(
        "--demo-release",
        choices=releases.KEYS,
        default=releases.V0_1_0,
        help="whose dump format --write-demo writes (default v0.1.0)",
    )


def _add_slime_flags(group) -> None:
    """The slime flags that decide what is a hazard (`ScanFlags`), defaulting to the case's."""
    defaults = case.scan_config()
    group.add_argument(
        "--n-samples-per-prompt",
        type=numbers.PARALLEL,
        default=defaults.n_samples_per_prompt,
        help=f"GRPO group size (default {defaults.n_samples_per_prompt})",
    )
    group.add_argument(
        "--reward-key", default=defaults.reward_key, help="key of a dict reward (default: rewards are numbers)"
    )
    group.add_argument(
        "--rollout-max-response-len",
        type=numbers.TOKENS,
        default=defaults.rollout_max_response_len,
        help=f"flag responses longer than this, >= 1 (default {defaults.rollout_max_response_len})",
    )
    estimators = ("grpo", "gspo", "cispo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo")
    group.add_argument(
        "--advantage-estimator",
        default=defaults.advantage_estimator,
        choices=estimators,
        metavar="NAME",  # the choices are listed in the help, where they wrap
        help=f"one of {', '.join(estimators)} (default {defaults.advantage_estimator})",
    )
    group.add_argument(
        "--disable-rewards-normalization",
        action="store_false",
        dest="rewards_normalization",
        default=defaults.rewards_normalization,
        help="no group normalisation of rewards (default: "
        f"{'normalised' if defaults.rewards_normalization else 'not normalised'})",
    )
    group.add_argument(
        "--disable-grpo-std-normalization",
        action="store_false",
        dest="grpo_std_normalization",
        default=defaults.grpo_std_normalization,
        help="subtract the group mean only (default: "
        f"{'also divide by std + 1e-6' if defaults.grpo_std_normalization else 'mean only'})",
    )
    group.add_argument(
        "--use-kl-loss",
        action=argparse.BooleanOptionalAction,
        default=defaults.use_kl_loss,
        help=f"the KL term is computed, even at --kl-loss-coef 0 (default: {'on' if defaults.use_kl_loss else 'off'})",
    )
    group.add_argument(
        "--kl-loss-type",
        choices=("kl", "k1", "k2", "k3", "low_var_kl"),
        default=defaults.kl_loss_type,
        help=f"(default {defaults.kl_loss_type}; k1 is v0.2.4's name for v0.1.0's kl)",
    )
    group.add_argument(
        "--use-tis",
        action=argparse.BooleanOptionalAction,
        default=defaults.use_tis,
        help=f"truncated importance sampling with rollout_log_probs (default: {'on' if defaults.use_tis else 'off'})",
    )


def run(args) -> int:
    if args.force and args.write_demo is None:
        raise UserError("--force goes with --write-demo PATH (it replaces an existing file there)")
    if args.write_demo is not None:
        return scan_demo.write(args)
    if not args.dump:
        raise UserError("no dump given (try: nanscope scan --write-demo rollout_data/12.pt)")
    directory = Path(args.dump).is_dir()
    _check_ray(args, directory)
    dumps, skipped = many.find_dumps(args.dump) if directory else ([args.dump], [])
    for line in skipped_lines(skipped):  # said, not silently dropped: a FIFO, a device, a directory named *.pt
        terminal.note(f"nanscope scan: {line}")
    files.check_outputs({"--json": args.json, "--html": args.html}, [("dump", path) for path in dumps])
    flags = ScanFlags(
        n_samples_per_prompt=args.n_samples_per_prompt,
        reward_key=args.reward_key,
        rollout_max_response_len=args.rollout_max_response_len,
        advantage_estimator=args.advantage_estimator,
        rewards_normalization=args.rewards_normalization,
        grpo_std_normalization=args.grpo_std_normalization,
        use_kl_loss=args.use_kl_loss,
        kl_loss_type=args.kl_loss_type,
        use_tis=args.use_tis,
        max_listed=args.max_per_sample,
        histograms=bool(args.html) and not directory,
    )
    show = sys.stderr.isatty() if args.progress is None else args.progress
    if not directory:
        return _run_file(args, flags, show)
    try:
        return _run_directory(args, dumps, flags, show)
    except proctree.Interrupted as e:
        terminal.note(f"nanscope scan: interrupted by {signal.Signals(e.signum).name}; its workers stopped")
        return e.exit_code


def _check_ray(args, directory: bool) -> None:
    if args.ray_address is not None and not args.ray:
        raise UserError(f"--ray-address {args.ray_address} goes with --ray")
    if args.ray_timeout is not None:
        if args.ray_address is None:
            raise UserError(f"--ray-timeout {args.ray_timeout:g} goes with --ray-address (joining a cluster)")
    if not args.ray:
        return
    ray_session.require("--ray")
    if not directory:
        raise UserError(f"--ray scans a directory of dumps, one Ray task a file: {files.shown(args.dump)} is not one")
    if args.ray_address is not None and not args.ray_address.strip():
        raise UserError("--ray-address: empty (give HOST:PORT of the cluster's head, or leave it out)")


def _scanner(args, stack: contextlib.ExitStack):
    """The directory scan's `scan_files`: the local processes', or Ray's within a Ray session (joined or started)."""
    if not args.ray:
        return many.scan_files
    cpus = args.workers or len(os.sched_getaffinity(0))
    timeout = args.ray_timeout if args.ray_timeout is not None else ray_session.TIMEOUT_S
    stack.enter_context(ray_session.session(args.ray_address, cpus=cpus, timeout_s=timeout))
    return ray_scan.scan_files


def _limits(args) -> Limits:
    return Limits(args.max_dump_mb * MiB, args.max_sample_tokens)


def _run_file(args, flags: ScanFlags, show: bool) -> int:
    from nanscope.dumps import io  # heavy: numpy (and torch to read tensors); --help needs neither
    from nanscope.dumps.result import hazard_count

    try:
        dump = io.load(
            args.dump,
            trust_pickle=args.trust_pickle,
            reward_key=flags.reward_key,
            cp_size=args.context_parallel_size,
            tp_size=args.tensor_model_parallel_size,
            limits=_limits(args),
        )
        result = _scan(dump, flags, show)
    except BrokenPipeError:  # the progress bar's stderr closed: not the dump's fault
        raise
    except OSError as e:  # the file read fails (an I/O error, a file in /proc): the file's fault, not ours
        raise UserError(f"{files.shown(args.dump)}: dump: cannot read: {e.strerror or e}") from None
    _render(args, result)
    if result.errors:
        more = f" (and {len(result.errors) - 1} more; see the table)" if len(result.errors) > 1 else ""
        raise UserError(result.errors[0] + more)
    return 1 if hazard_count(result) else 0


def _scan(dump, flags: ScanFlags, show: bool):
    """Check the streaming samples, with a bar (file read, or samples done) and tokens/s when `show`."""
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn  # heavy: rich

    from nanscope.dumps import checks

    if not show:
        return checks.scan(dump, flags)
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TextColumn("{task.fields[tokens]:,} tokens, {task.fields[rate]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=terminal.console(stderr=True), transient=True) as bar:
        task = bar.add_task(_label(os.path.basename(dump.path)), total=None, tokens=0, rate="")
        t0, tokens = time.perf_counter(), 0

        def step(n: int) -> None:
            nonlocal tokens
            tokens += n
            done, total = dump.progress()
            rate = f"{tokens / max(time.perf_counter() - t0, 1e-9) / 1e6:.1f}M tokens/s"
            bar.update(task, completed=done, total=total, tokens=tokens, rate=rate)

        return checks.scan(dump, flags, progress=step)


def _run_directory(args, paths: list, flags: ScanFlags, show: bool) -> int:
    from nanscope.dumps import trend  # heavy: numpy, and rich below; only a scan needs them
    from nanscope.report import scan as report
    from nanscope.report import trend as report_trend

    console = terminal.console()
    opts = dict(
        trust_pickle=args.trust_pickle,
        cp_size=args.context_parallel_size,
        tp_size=args.tensor_model_parallel_size,
        limits=_limits(args),
        workers=args.workers,
    )
    with contextlib.ExitStack() as stack:
        if not args.ray:  # Ctrl-C or kill ends the scan now, its workers first (Ray's session has its own)
            opts["check"] = stack.enter_context(proctree.StopSignals()).check
        scan_files = _scanner(args, stack)
        quiet = args.quiet or args.progress is False  # --no-progress: neither the bar nor the lines
        with progress.Lines("scan", quiet=quiet, total=len(paths), bar=show) as lines:
            summaries = scan_files(paths, flags, **opts, done=_file_lines(lines, len(paths)))
    report.render_directory(summaries, console, args.dump)
    series = trend.trend(summaries)
    for line in report_trend.terminal_lines(series, args.dump):
        console.print(line, highlight=False, markup=False)
    if args.json:
        report.write_directory_json(summaries, args.json, series)
    if args.html:
        report_trend.write_directory_html(summaries, args.dump, series, args.html)
    failed = [summary for summary in summaries if summary.error or summary.errors]
    if failed:
        first = failed[0].error or failed[0].errors[0]
        raise UserError(f"{len(failed)} of {len(summaries)} dumps failed; the first: {first}")
    return 1 if any(summary.total for summary in summaries) else 0


def _file_lines(lines: progress.Lines, total: int):
    """scan_files' `done`: one line a file scanned, in the order they finish."""
    count = 0

    def done(summary) -> None:
        nonlocal count
        count += 1
        if summary.error or summary.errors:
            what = "failed"
        else:
            what = f"{words.count(summary.total, 'finding', grouped=True)}, would produce NaN: {summary.would_nan}"
        lines(f"file {count} of {total}: {files.shown(summary.path)}: {what}")

    return done


def _label(name: str) -> str:
    """The progress bar's description (rich markup): a file's name escaped, never markup."""
    from rich.markup import escape  # heavy: rich, only a scan needs it

    return escape(f"scanning {printable(name)}")


def _render(args, result) -> None:
    from nanscope.report import scan as report  # heavy: rich and numpy, only a scan needs them

    console = terminal.console()
    report.render_terminal(result, console, max_rows=args.max_rows)
    if args.json:
        report.write_json(result, args.json)
    if args.html:
        report.write_html(result, args.html)
