"""`nanscope scan --write-demo`: demo dumps to try scan on, written whole or not at all (`report.files`).

One dump with known hazards planted (--demo-kind rollout or train), its rollout_id the one its name gives; or a
drifting run (--demo-kind run): a directory of rollout and train dumps, one rollout each, whose log-ratio maxima
cross 88.72 at the last, for `scan DIR`'s trend.
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

from nanscope import outputs
from nanscope.cli import terminal
from nanscope.dumps import many
from nanscope.errors import UserError
from nanscope.report import files

FLAG = "--write-demo"


def write(args) -> int:
    """`scan --write-demo PATH`: one demo dump, or with --demo-kind run a drifting run's; what it planted, printed."""
    from nanscope.dumps import demo  # heavy: torch, only --write-demo writes a dump

    given = [
        flag for flag, value in (("a dump to scan", args.dump), ("--json", args.json), ("--html", args.html)) if value
    ]
    if given:
        raise UserError(
            f"{FLAG} writes a demo and exits: not with {', '.join(given)} (scan the demo afterwards: "
            f"nanscope scan {files.shown(args.write_demo)})"
        )
    if args.demo_kind == "run":
        return _write_run(args)
    files.check_outputs({FLAG: args.write_demo}, replace=args.force, parents=True)
    named = many.name_rollout(args.write_demo)
    rollout_id = demo.DEMO_ROLLOUT if named is None else named
    buffer = io.BytesIO()  # serialised in memory: the disk's refusal is then an OSError with its reason
    planted = demo.write_demo(buffer, kind=args.demo_kind, rollout_id=rollout_id, release=args.demo_release)
    files.write_bytes(args.write_demo, buffer.getvalue(), FLAG, parents=True)
    say = _printer()
    say(
        f"wrote {args.demo_kind} dump {files.shown(args.write_demo)} (rollout {rollout_id}, slime {args.demo_release} format) "
        f"with {len(planted)} planted hazards:"
    )
    for hazard in planted:
        where = f"sample {hazard.sample}" + (f" token {hazard.token}" if hazard.token is not None else "")
        say(f"  {hazard.kind:<26} {where:<20} {hazard.what}")
    say(f"now run: nanscope scan {files.shown(args.write_demo)}")
    return 0


def _write_run(args) -> int:
    """`--write-demo DIR --demo-kind run`: the drifting run's dumps under DIR, slime's two dump directories."""
    from nanscope.dumps import demo  # heavy: torch, only --write-demo writes a dump

    root = Path(args.write_demo)
    _check_run_directory(root, demo.drifting_run_paths(root), args.force)
    dumps: dict[Path, bytes] = {}
    demo.write_drifting_run(root, release=args.demo_release, opener=lambda path: _in_memory(path, dumps))
    _write_all(dumps)
    last = demo.DRIFT_ROLLOUTS - 1
    say = _printer()
    say(
        f"wrote a drifting run of {demo.DRIFT_ROLLOUTS} rollouts under {root} (slime {args.demo_release} format): "
        f"rollout dumps rollout_data/0.pt .. {last}.pt, train dumps train_data/0_0.pt .. {last - 1}_0.pt (the last "
        f"rollout's training is the one that fails: no train dump); a masked token's KL log-ratio grows "
        f"{demo.DRIFT_KL_STEP:g} a rollout, 0 .. {demo.DRIFT_KL_STEP * last:g}, past 88.72 at rollout {last}"
    )
    say(f"now run: nanscope scan {files.shown(root)} --html trend.html")
    return 0


def _printer():
    """print() at the terminal's width (`cli.terminal`): a long line wraps between words."""
    console = terminal.console(highlight=False, emoji=False)  # a path's ':name:' stays text
    return lambda line: console.print(line, markup=False)


def _check_run_directory(root: Path, paths: list[Path], force: bool) -> None:
    """DIR and its two dump directories are directories of their own, never links; every target is checked before
    the first is written: nothing half-replaced."""
    if root.is_symlink():
        raise files.through_link(FLAG, root, fix="name the directory itself, or remove the link")
    if root.exists() and not root.is_dir():
        raise UserError(f"{FLAG} {files.shown(root)}: not a directory (--demo-kind run writes a directory)")
    for path in paths:
        link = outputs.link_in(path.parent, root)
        if link is not None:
            raise files.through_link(FLAG, root, link, fix="remove the link")
        files.check_writable(path, FLAG, replace=force, parents=True)


@contextlib.contextmanager
def _in_memory(path: Path, dumps: dict):
    """The demo's writer for one file: a buffer, kept as `path`'s bytes."""
    buffer = io.BytesIO()
    yield buffer
    dumps[path] = buffer.getvalue()


def _write_all(dumps: dict[Path, bytes]) -> None:
    """Every file written, or, when one cannot be, the files this call made and their new directories removed."""
    made: list[str] = []
    new: list[Path] = []
    try:
        for path, data in dumps.items():
            made += _directories(path.parent)
            fresh = not os.path.lexists(path)
            files.write_bytes(path, data, FLAG)
            new += [path] if fresh else []
    except BaseException:
        for path in new:
            with contextlib.suppress(OSError):
                os.unlink(path)
        outputs.remove_directories(sorted(made, key=len, reverse=True))
        raise


def _directories(directory: Path) -> list[str]:
    try:
        return outputs.make_directories(directory)
    except OSError as e:
        raise UserError(f"{FLAG} {files.shown(directory)}: cannot make the directory: {e.strerror or e}") from None
