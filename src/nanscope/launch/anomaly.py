"""The forward call autograd's anomaly mode prints before a backward function's error: its frames, and the last one.

    .../torch/autograd/graph.py:744: UserWarning: Error detected in MmBackward0. Traceback of forward call that caused the error:
      File "train.py", line 50, in <module>
        loss = model(x)
      ...
      File ".../peft/tuners/lora/layer.py", line 569, in forward
        result = result + lora_B(lora_A(dropout(x))) * scaling
     (Triggered internally at ../torch/csrc/autograd/python_anomaly_mode.cpp:111.)
      return Variable._execution_engine.run_backward(  # Calls into the C++ engine to run the backward pass
    Traceback (most recent call last):
    ...
    RuntimeError: Function 'MmBackward0' returned nan values in its 1th output.

At the forward op, anomaly mode stores the Python stack (PyAnomalyMetadata::store_stack: torch.fx.traceback's
format_stack, traceback.format_list(traceback.extract_stack()[:-1]): outermost first); when the node's backward
fails it warns `Error detected in <node>. Traceback of forward call that caused the error:` and that stack
(_format_stack; pytorch/pytorch 042876c torch/csrc/autograd/python_anomaly_mode.cpp:16-25, :113-116). So the last
frame is the forward op's own call. Reading is bounded: the header is found by a literal search from the end, and
at most WINDOW bytes after it are decoded.

    lines = forward_lines(before, clean)      # the warning's lines after its header, up to the error's traceback
    frame, cut = last_frame(frames, lines)    # its last frame; whether the paste left lines out after it
    short = short_of_op(frames, lines)        # (why the frames end before the op's call, the last frame outside torch)
"""

from __future__ import annotations

import re

HEADER = b"Traceback of forward call"
SOURCE = "pytorch/pytorch 042876c torch/csrc/autograd/python_anomaly_mode.cpp:16-25, :113-116; torch/fx/traceback.py"
WINDOW = 65536  # bytes read after the header
_END = ("Traceback (most recent call last):",)  # the error's own traceback: the forward call's frames end before it
_TRIGGERED = "(Triggered internally at"  # c10's suffix to the warning: the forward stack's end
# a line that says lines were left out (`...stacktrace...`, `...`, `…`)
_ELIDED = re.compile(r"\s{0,8}(?:\.{3}|\u2026)")
# torch's module dispatch: `module(x)` is Module.__call__ = _wrapped_call_impl, which calls _call_impl, which calls the
# module's forward (torch 2.13.0 torch/nn/modules/module.py:1774-1778, :1782-1789, :1917): a frame of it calls a
# module, never an op, so the op's own call is a frame further in
DISPATCH = ("_wrapped_call_impl", "_call_impl")
DISPATCH_SOURCE = "torch 2.13.0 torch/nn/modules/module.py:1774-1789, :1917"
# torch's Python wrapper of a Tensor operator: `x ** 2` calls Tensor.__pow__, `2 - x` Tensor.__rsub__, each wrapped by
# _handle_torch_function_and_wrap_type_error_to_not_implemented, whose `wrapped` calls the op (torch 2.13.0
# torch/_tensor.py:29-43, :1106-1126): the expression that used the operator is the last frame outside torch
OPERATOR_SOURCE = "torch 2.13.0 torch/_tensor.py:29-43, :1106-1126"
_TORCH = re.compile(r"(?:^|[/\\](?:site|dist)-packages[/\\])torch[/\\]")


def forward_lines(before: bytes, clean) -> list[str]:
    """The lines of the last anomaly-mode warning in `before` after its header (`clean`: a raw line as a terminal
    shows it), up to the error's own traceback; [] without such a warning."""
    at = before.rfind(HEADER)
    if at < 0:
        return []
    start = before.find(b"\n", at)
    if start < 0:
        return []
    lines = []
    for raw in before[start + 1 : start + 1 + WINDOW].decode("utf-8", "replace").split("\n"):
        line = clean(raw)
        if line.strip().startswith(_END) or lines and not line.strip():  # the error's traceback, or a blank line:
            break  # the paste's next part (HaiyuWu/Vec2Face#9, holdout25 02: another poster's backward call after it)
        lines.append(line)
        if _TRIGGERED in line:
            break
    return lines


def last_frame(frames, lines: list[str]):
    """(the forward call's last frame, whether the paste left lines out after it: a `...` line after that frame's);
    (None, False) without frames."""
    if not frames:
        return None, False
    frame = frames[-1]
    mark = f", line {frame.line}, in {frame.function}"
    at = max((i for i, line in enumerate(lines) if mark in line), default=len(lines))
    return frame, any(_ELIDED.match(line) is not None for line in lines[at + 1 :])


def _torchs(frame) -> bool:
    return _TORCH.search(frame.path[-300:].replace("\\", "/")) is not None


def short_of_op(frames, lines: list[str]):
    """(why the forward call's frames end before the op's own call, the last frame outside torch: the call it came
    through, or None): `cut` where a partial `File "` line follows the last whole frame, `dispatch` where that frame is
    torch's module dispatch, `operator` where it is torch's wrapper of a Tensor operator (it calls the op: the
    expression is the frame outside torch), several joined by spaces; None where the last frame may be the op's call,
    or no frames."""
    if not frames:
        return None
    frame = frames[-1]
    mark = f", line {frame.line}, in {frame.function}"
    at = max((i for i, line in enumerate(lines) if mark in line), default=len(lines))
    why = ["cut"] if any('File "' in line for line in lines[at + 1 :]) else []
    path = frame.path.replace("\\", "/")
    if frame.function in DISPATCH and path.endswith("torch/nn/modules/module.py"):
        why.append("dispatch")
    if frame.function == "wrapped" and path.endswith("/_tensor.py") and _torchs(frame):
        why.append("operator")
    if not why:
        return None
    return " ".join(why), next((each for each in reversed(frames) if not _torchs(each)), None)
