"""``GradwatchCallback`` for the Hugging Face ``transformers.Trainer``.

The callback watches the model when training begins, closes one gradwatch step per
optimizer step (``gradient_accumulation_steps`` batches make one, as in the
Trainer's ``global_step``), one epoch at each epoch's end, and ends the run when
training ends. The step's loss is the one the Trainer trains on: the model's output
``loss`` of each batch, or the first item of an output that is a tuple or list (as the
Trainer takes it; read by a forward hook while the model is in training mode),
combined over the accumulated batches the way the Trainer combines what it logs: a
mean, or a sum where the model was given ``num_items_in_batch`` (which the model is
expected to divide its loss by: the tokens of the whole window). A model that takes the
argument through ``**kwargs`` and ignores it (transformers 5's
``BertForSequenceClassification``) returns undivided losses, and with
``gradient_accumulation_steps=4`` the Trainer trains on and logs about 4x the loss: so
does gradwatch, which records what the Trainer trained on. A loss computed outside the model
(``compute_loss_func``, label smoothing) is not the one seen here.

A ``TrainerCallback`` hears of no exception (transformers has no ``on_exception``
event, and its callbacks are not given the Trainer). So the callback finds its
Trainer once, in ``on_init_end`` (called at the end of ``Trainer.__init__``): the one
on the call stack whose callback handler holds this callback. It wraps that
instance's ``train`` (an attribute of the instance, not of the class): an exception
that leaves ``train()``, from a batch, a forward or backward, the optimizer, an
evaluation or another callback, ends the run ``crashed`` at once, then propagates
unchanged. A program that catches it and goes on (a sweep, a notebook) sees the run
crashed, not live. A callback added after the Trainer was made
(``trainer.add_callback``) is not there at ``on_init_end``: it finds the Trainer in
``on_train_begin`` instead, inside the ``train()`` already running, and wraps what
that call still looks up on the instance each time: ``training_step`` (forward and
backward) and ``get_batch_samples`` (the batches), and ``train`` for later calls.
Anything else that fails, such a run ends ``crashed`` at process exit (gradwatch's
exit handler), or at once when the program calls :meth:`GradwatchCallback.close`
with ``status="crashed"``.

With ``fp16=True``, accelerate's GradScaler (the Trainer's ``accelerator.scaler``) goes
to ``watch(scaler=)`` unless the callback was given one: backward leaves the gradients
multiplied by the loss scale, and the scaler skips the steps that overflow.

Example:
    >>> from transformers import Trainer  # doctest: +SKIP
    >>> from gradwatch.integrations.transformers import GradwatchCallback  # doctest: +SKIP
    >>> trainer = Trainer(model, args, train_dataset=data,  # doctest: +SKIP
    ...                   callbacks=[GradwatchCallback(run="bert-ft")])
    >>> trainer.train()  # doctest: +SKIP
"""

from __future__ import annotations

import functools
import os
import sys
import time
from types import FrameType
from typing import Any

import torch
from torch import nn

try:
    from transformers import TrainerCallback
except ImportError as e:  # pragma: no cover - exercised only without transformers
    raise ImportError(
        "gradwatch.integrations.transformers needs transformers: "
        "pip install 'gradwatch[transformers]'"
    ) from e

from gradwatch.trainer_hooks import Monitor, watch


def _output_loss(output: Any) -> torch.Tensor | None:
    """The loss the Trainer trains on in a model's output, or None.

    ``output.loss`` of a ``ModelOutput`` (or a mapping's ``"loss"``), or the first item
    of a tuple or list (``return_dict=False``, a plain module's ``(loss, logits)``): the
    Trainer's ``compute_loss`` takes ``outputs[0]`` of anything not a mapping.

    Example:
        >>> loss = torch.tensor(0.5)
        >>> _output_loss((loss, torch.zeros(4, 2))) is loss
        True
        >>> _output_loss({"loss": loss}) is loss
        True
        >>> _output_loss((torch.zeros(4, 2),)) is None  # logits, not a loss
        True
    """
    if isinstance(output, dict):
        loss = output.get("loss")
    elif isinstance(output, (tuple, list)) and output:
        loss = output[0]
    else:
        loss = getattr(output, "loss", None)
    return loss if isinstance(loss, torch.Tensor) and loss.numel() == 1 else None


class GradwatchCallback(TrainerCallback):
    """Monitor a ``transformers.Trainer`` with gradwatch: ``callbacks=[GradwatchCallback()]``.

    Args:
        run: the run's name in the dashboard.
        server: ``ws://host:port`` of a gradwatch server, or None to record a spool.
        spool: the spool file (see :func:`gradwatch.trainer_hooks.watch`).
        **watch_options: any other :func:`~gradwatch.trainer_hooks.watch` keyword.

    Example:
        >>> cb = GradwatchCallback(run="demo", spool="run.jsonl")
        >>> cb.monitor is None
        True
    """

    def __init__(
        self,
        run: str = "run",
        server: str | None = None,
        spool: str | os.PathLike[str] | None = None,
        **watch_options: Any,
    ) -> None:
        self.run = run
        self.server = server
        self.spool = spool
        self.watch_options = watch_options
        self.monitor: Monitor | None = None
        # each training forward's loss, and whether it was already scaled to the window
        self._losses: list[tuple[torch.Tensor, bool]] = []
        # the last training batch's loss with its autograd graph (what backward ran
        # from): the graph's size and the stale-state and kept-loss checks read it
        self._graph: torch.Tensor | None = None
        self._hook: Any = None

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        trainer = self._find_trainer()
        if trainer is not None:
            self._guard(trainer, ("train",))

    def _find_trainer(self) -> Any:
        """The ``Trainer`` on the call stack whose callbacks include this one, or None."""
        frame: FrameType | None = sys._getframe(1)
        while frame is not None:
            candidate = frame.f_locals.get("self")
            handler = getattr(candidate, "callback_handler", None)
            if self in getattr(handler, "callbacks", ()):
                return candidate
            frame = frame.f_back
        return None

    def _guard(self, trainer: Any, names: tuple[str, ...]) -> None:
        """Wrap these methods of this Trainer instance: an exception leaving one ends the
        run ``crashed`` at once, then propagates unchanged."""
        for name in names:
            method = getattr(trainer, name, None)
            if method is None or getattr(method, "_gradwatch_guard", False):
                continue

            def guarded(*args: Any, _method: Any = method, **kwargs: Any) -> Any:
                try:
                    return _method(*args, **kwargs)
                except BaseException:
                    self.close("crashed")
                    raise

            guarded = functools.wraps(method)(guarded)
            guarded._gradwatch_guard = True  # type: ignore[attr-defined]
            setattr(trainer, name, guarded)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        model = kwargs.get("model")
        if not isinstance(model, nn.Module):
            return
        trainer = self._find_trainer()
        if self.monitor is None or self.monitor.closed:
            options = dict(self.watch_options)
            # fp16: accelerate's GradScaler multiplies the gradients by the loss scale
            # (65536 at first) and skips the steps that overflow
            scaler = getattr(getattr(trainer, "accelerator", None), "scaler", None)
            if scaler is not None:
                options.setdefault("scaler", scaler)
            self.monitor = watch(
                model, run=self.run, server=self.server, spool=self.spool, **options
            )
        if self._hook is None:
            self._hook = model.register_forward_hook(self._on_forward, with_kwargs=True)
        self._losses, self._graph = [], None
        if trainer is not None and not getattr(trainer.train, "_gradwatch_guard", False):
            # added after the Trainer was made: this train() is already running
            self._guard(trainer, ("train", "training_step", "get_batch_samples"))

    def _on_forward(
        self, module: nn.Module, args: Any, kwargs: dict[str, Any], output: Any
    ) -> None:
        # evaluation and prediction run the same forward: only training batches count
        if module.training and torch.is_grad_enabled():
            started = time.perf_counter()
            loss = _output_loss(output)
            if loss is not None:
                scaled = kwargs.get("num_items_in_batch") is not None
                self._losses.append((loss.detach(), scaled))
                self._graph = loss if loss.grad_fn is not None else None
            if self.monitor is not None:  # what the callback costs counts in `overhead`
                self.monitor.charge(time.perf_counter() - started)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        monitor = self.monitor
        if monitor is None:
            return
        started = time.perf_counter()
        losses, self._losses = self._losses, []
        graph, self._graph = self._graph, None
        loss: torch.Tensor | None = None
        if losses:
            # device ops only, no host sync: the value the Trainer sums for this step
            n = len(losses)
            loss = torch.stack([x.float() if scaled else x.float() / n for x, scaled in losses])
            loss = loss.sum()
        monitor.charge(time.perf_counter() - started)
        monitor.step(loss, graph=graph)

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.monitor is not None:
            self.monitor.epoch()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.close("finished")

    def close(self, status: str = "finished") -> None:
        """End the run now (``"finished"`` or ``"crashed"``) and take the hooks off."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self.monitor is not None and not self.monitor.closed:
            self.monitor.close(status=status)
