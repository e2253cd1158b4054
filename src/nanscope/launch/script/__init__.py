"""Static reading of slime launch scripts: the argument list that reaches `python3 train.py`.

The script is parsed with tree-sitter-bash and *interpreted*, never executed (real launch scripts run
`pkill -9 python`, `ray stop`, `rm -rf`). Supported: scalar and array assignments (`X=( ... )` with
comments and line continuations, `+=`), `export`/`declare`/`local`, associative arrays (`declare -A M=([tp]=2)`,
`M[k]=v`, `${M[k]}`, `${!M[@]}`, in bash's order), `$X` `${X}` `${X[@]}` `${X[i]}` `${X:-default}`,
`$((...))` integer arithmetic, `$(seq a [b] c)`, single/double quotes and word splitting, `source FILE` /
`. FILE`, and the script's own functions, read where it calls them (`$1`, `"$@"`, `local`, `shift`).
Every other command substitution stays in the output as its own text (e.g. `$(nvidia-smi topo -m ...)`),
so a placeholder is visible instead of a failure.

Reading is bounded, whatever the script: files are regular and at most `bounds.INPUT_LIMIT` bytes;
nesting, value and array sizes, `seq` and the total expansion work are capped (`bounds.MAX_*`);
arithmetic is bash's signed 64-bit, and numbers follow bash's rules (`017` octal, `0x1f`,
`base#digits`). A value that hits a cap, overflows, or that bash would reject (`08`, `65#1`, division
by 0) becomes a placeholder with a note in `LaunchScript.limits`; the rest of the script still reads.

The result is the argument list of the *last* `python[3] <script>.py ...` command in the file,
including one behind `ray job submit ... --`.

    syntax.py       the tree-sitter-bash parser; a node's line and text
    bounds.py       the reading caps (INPUT_LIMIT, MAX_*) and what one reading has spent of them
    arithmetic.py   bash integer arithmetic and `[ ... ]` comparisons on known values
    expansion.py    words -> fields with the variables set so far (Placeholder for what is not known)
    arrays.py       indexed and associative arrays (bash's order of keys)
    calls.py        the script's functions, read at each call
    interpreter.py  the statements in order: assignments, `source`, `if`, function calls, the train command
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from nanscope import inputs
from nanscope.errors import UserError
from nanscope.launch.script.bounds import INPUT_LIMIT, OPTION
from nanscope.launch.script.expansion import Placeholder
from nanscope.launch.script.interpreter import Interpreter, Source


class NotALaunch(UserError):
    """The file was read, but nothing in it is a launch nanscope reads: no train command, or a text tree-sitter-bash
    gives up on (a log, a Python file, a wrapper whose target is elsewhere). `wrapped`: the scripts a wrapper runs."""

    def __init__(self, message: str, wrapped: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.wrapped = wrapped


@dataclass
class LaunchScript:
    """What a launch script resolves to.

    Attributes:
        path: the script.
        train_script: the python file after `python3` (e.g. `deepresearch/train.py`), `-m <module>`
            (`-m verl.trainer.main_ppo`), or a training CLI (`megatron sft`).
        argv: the resolved arguments after the train script (one string per shell word).
        launcher: the words before `python3` on that command, e.g. `ray job submit ... --`.
        line: 1-based line where the train command starts.
        variables: the shell variables at the end of the script (str or list[str]).
        unset: variables read but never set, name -> first line read.
        unset_arrays: those of `unset` read as arrays (`${X[@]}`), which expand to nothing.
        placeholders: run-time values kept as text.
        sources: the `source` statements met, in order.
        syntax_errors: 1-based lines where tree-sitter reported an error node.
        assumptions: conditions that could not be decided statically, and what was assumed.
        limits: values that hit a reading cap, overflowed or that bash would reject, kept as text.
        command_env: the `NAME=value` words before the train command (its own environment).
        cut: a comment line inside the train command's backslash continuation ended it there, as bash does (the note).
    """

    path: str
    train_script: str
    argv: list[str]
    launcher: list[str]
    line: int
    variables: dict
    unset: dict[str, int]
    unset_arrays: list[str]
    placeholders: list[Placeholder]
    sources: list[Source]
    syntax_errors: list[int] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)
    limits: list[str] = field(default_factory=list)
    command_env: dict[str, str] = field(default_factory=dict)
    read_as: list[str] = field(default_factory=list)  # how a Slurm wrapper was read (`bash -c`, #SBATCH)
    pasted: str | None = None  # a Markdown paste given as the script: what of it was read (script.markdown)
    cut: str | None = None  # the train command cut short by a comment in its `\` continuation, said as bash cuts it
    earlier: list[tuple[int, str]] = field(
        default_factory=list
    )  # the train commands before the one read: (line, script)


def parse_script(
    path: str | os.PathLike, env: dict[str, str] | None = None, model_args: str | None = None, limit: int = INPUT_LIMIT
) -> LaunchScript:
    """Read a launch script statically and return its train command's arguments.

    Args:
        path: the launch script.
        env: variables the script reads from its environment (`--env TOTAL_NODES=8`).
        model_args: a model-args file to read in place of a `source` that cannot be found.
        limit: the most bytes read from one file (the script, a sourced file, the model-args file).

    Raises:
        UserError: a file that is missing, not a regular file or over `limit`, or no
            `python3 <script>.py` command in the script.
    """
    reader = Interpreter(env or {}, model_args, limit)
    if model_args is not None:
        inputs.check_file(model_args, "model-args file", limit, OPTION)  # fail early and clearly
    reader.run_file(str(path))
    train = reader.train
    if train is None:
        hint = f" (tree-sitter reported syntax errors at lines {_lines(reader.errors)})" if reader.errors else ""
        hint += reader.budget.stop_hint() + reader.calls.uncalled_hint()
        if reader.wrapped:
            hint += (f" (a wrapper: it runs {', '.join(reader.wrapped[:3])}, which nanscope cannot read here: give "
                     "that script as the launch script)")  # fmt: skip
        raise NotALaunch(
            f"{path}: no train command found: expected `python3 <train script>.py ...` (or `python3 -m <module>`, "
            f"`torchrun ... <script>.py`, `megatron sft ...`), directly or after `ray job submit ... --`{hint}",
            tuple(reader.wrapped),
        )
    if model_args is not None and reader.model_args is not None:
        reader.assumptions.append(f"--model-args {model_args}: not used (no `source` in the script was missing)")
    words = " ".join(train.argv)  # a placeholder with spaces may have been split into several words
    expander = reader.words
    return LaunchScript(
        path=str(path),
        train_script=train.script,
        argv=train.argv,
        launcher=train.launcher,
        line=train.line,
        variables=expander.vars,
        unset=expander.unset,
        unset_arrays=expander.unset_arrays,
        placeholders=[placeholder for placeholder in expander.placeholders.values() if placeholder.text in words],
        sources=reader.sources,
        syntax_errors=reader.errors,
        assumptions=reader.assumptions,
        limits=reader.budget.all_notes(),
        command_env=train.env,
        cut=reader.cut,
        earlier=reader.earlier,
        pasted=reader.pasted,
        read_as=reader.read_as,
    )


def _lines(lines: list[int]) -> str:
    return ", ".join(map(str, lines[:5])) + (" ..." if len(lines) > 5 else "")


def parse_env(items: list[str] | None) -> dict[str, str]:
    """`["K=V", ...]` -> dict; a malformed item is a UserError."""
    env = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise UserError(f"--env {item!r}: expected NAME=VALUE")
        env[key] = value
    return env
