"""The code lines a traceback prints under its frames that name the library whose frame they are: what is left of a
traceback whose `File "..."` lines were lost (several processes writing one stream at once glue their lines
together and drop some), one table.

A line is known only where its exact text (as the traceback prints it: stripped) is a frame of that library at the
release cited. A line every training loop writes (`self.accelerator.backward(loss)`, `self.optimizer.step()`,
`train_result = trainer.train()`) is no library's and is not here. A text another library's frame holds too is
`shared`: it names no framework by itself, and is read as `stack`'s only where something else names `stack`.

    from nanscope.facts.code_lines import LINES
"""

from __future__ import annotations

from dataclasses import dataclass

from nanscope.facts.frameworks import DEEPSPEED, MMCV, TRANSFORMERS


@dataclass(frozen=True)
class CodeLine:
    """One known code line.

    Attributes:
        text: the line as a traceback prints it (stripped).
        stack: the framework (facts.frameworks.NAMES) whose job its frame shows: accelerate's DeepSpeed branch is
            DeepSpeed's (it runs only when accelerate drives DeepSpeed's engine).
        library: whose code it is, in words.
        where: "<release> <file>:<line> <function>", the frame at the release read.
        does: what the call on it does, in words.
        shared: other libraries' frames that hold the same text (framework, where).
        raises: what alone makes the call raise, in words (None: not read).
        points: the facts.signals id of that error (its source cites where it is raised).
    """

    text: str
    stack: str
    library: str
    where: str
    does: str
    shared: tuple[tuple[str, str], ...] = ()
    raises: str | None = None
    points: str | None = None


LINES: tuple[CodeLine, ...] = (
    CodeLine(
        "return inner_training_loop(",
        TRANSFORMERS,
        "transformers' Trainer",
        "transformers 4.31.0 src/transformers/trainer.py:1539 Trainer.train",
        "its train runs the training loop",
    ),
    CodeLine(
        "tr_loss_step = self.training_step(model, inputs)",
        TRANSFORMERS,
        "transformers' Trainer",
        "transformers 4.31.0 src/transformers/trainer.py:1809 Trainer._inner_training_loop",
        "its loop runs one step's forward and backward (training_step)",
    ),
    CodeLine(
        "self.deepspeed_engine_wrapped.backward(loss, **kwargs)",
        DEEPSPEED,
        "accelerate's Accelerator",
        "accelerate 0.21.0 src/accelerate/accelerator.py:1847 Accelerator.backward",
        "its backward hands the loss to DeepSpeed's engine, which then takes the optimizer step "
        "(DeepSpeedEngineWrapper.backward: engine.backward, engine.step; accelerate 0.21.0 utils/deepspeed.py:165-176)",
    ),
    CodeLine(
        "self._take_model_step(lr_kwargs)",
        DEEPSPEED,
        "DeepSpeed's engine",
        "DeepSpeed 0.16.4 deepspeed/runtime/engine.py:2322 DeepSpeedEngine.step (pipe/engine.py:1223 "
        "PipelineEngine._exec_optimizer_step)",
        "its step takes the optimizer's step",
    ),
    CodeLine(
        "self.loss_scaler.update_scale(has_overflow)",
        DEEPSPEED,
        "DeepSpeed's ZeRO optimizer",
        "DeepSpeed 0.16.4 deepspeed/runtime/zero/stage_1_and_2.py:2077 and stage3.py:2464 _update_scale "
        "(0.10.0: :1908, :2127)",
        "its step updates the fp16 loss scale after its overflow check (_update_scale)",
        shared=((MMCV, "mmcv 1.7.2 mmcv/runner/hooks/optimizer.py:490 Fp16OptimizerHook.after_train_iter"),),
        # DynamicLossScaler.update_scale raises only there (loss_scaler.py:170-176 at 0.10.0 and 0.16.4, with
        # raise_error_at_min_scale, its default: :125); the static LossScaler's update_scale does nothing (:58)
        raises="the loss scaler's update raises only where the fp16 loss scale is already at its minimum and the "
        "step overflowed again",
        points="loss-scale-minimum",
    ),
)
