"""`nanscope scan --write-demo`: demo dumps to try scan on, written whole or not at all (`report.files`).

One dump with known hazards planted (--demo-kind rollout or train), its rollout_id the one its name gives; or a
drifting run (--demo-kind run): a directory of rollout and train dumps, one rollout each, whose log-ratio maxima
cross 88.72 at the last, for `scan DIR`'s trend.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from nanscope.dumps import many
from nanscope.errors import UserError
from nanscope.report import files


def write(args) -> int:
    """`scan --write-demo PATH`: one demo dump, or with --demo-kind run a drifting run's; what it planted, printed."""
    from nanscope.dumps import demo  # heavy: torch, only --write-demo writes a dump

    if args.demo_kind == "run":
        return _write_run(args)
    target = {"--write-demo": args.write_demo}
    files.check_outputs(target, replace=args.force, parents=True)
    named = many.name_rollout(args.write_demo)
    rollout_id = demo.DEMO_ROLLOUT if named is None else named
    with _writing(args.write_demo) as temporary:
        planted = demo.write_demo(temporary, kind=args.demo_kind, rollout_id=rollout_id, release=args.demo_release)
    print(
        f"wrote {args.demo_kind} dump {args.write_demo} (rollout {rollout_id}, slime {args.demo_release} format) "
        f"with {len(planted)} planted hazards:"
    )
    for hazard in planted:
        where = f"sample {hazard.sample}" + (f" token {hazard.token}" if hazard.token is not None else "")
        print(f"  {hazard.kind:<26} {where:<20} {hazard.what}")
    print(f"now run: nanscope scan {args.write_demo}")
    return 0


@contextlib.contextmanager
def _writing(path):
    """A temporary file renamed onto `path` once whole (its directories made); a writer's failure is one line."""
    with files.replacing(path, "--write-demo", parents=True) as temporary:
        try:
            yield temporary
        except RuntimeError as e:  # torch.save's writer: the disk is full, the file system refuses
            raise UserError(f"--write-demo {files.shown(path)}: cannot write: {_first_line(e)}") from None


def _write_run(args) -> int:
    """`--write-demo DIR --demo-kind run`: the drifting run's dumps under DIR, slime's two dump directories."""
    from nanscope.dumps import demo  # heavy: torch, only --write-demo writes a dump

    root = Path(args.write_demo)
    if root.exists() and not root.is_dir():
        raise UserError(f"--write-demo {files.shown(root)}: not a directory (--demo-kind run writes a directory)")
    paths = demo.drifting_run_paths(root)
    for path in paths:  # every target checked before the first is written: nothing half-replaced
        files.check_writable(path, "--write-demo", replace=args.force, parents=True)
    demo.write_drifting_run(root, release=args.demo_release, opener=_writing)
    last = demo.DRIFT_ROLLOUTS - 1
    print(
        f"wrote a drifting run of {demo.DRIFT_ROLLOUTS} rollouts under {root} (slime {args.demo_release} format): "
        f"rollout dumps rollout_data/0.pt .. {last}.pt, train dumps train_data/0_0.pt .. {last - 1}_0.pt (the last "
        f"rollout's training is the one that fails: no train dump); a masked token's KL log-ratio grows "
        f"{demo.DRIFT_KL_STEP:g} a rollout, 0 .. {demo.DRIFT_KL_STEP * last:g}, past 88.72 at rollout {last}"
    )
    print(f"now run: nanscope scan {root} --html trend.html")
    return 0


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]
