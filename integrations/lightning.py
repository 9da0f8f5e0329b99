"""``GradwatchCallback`` for Lightning (``lightning`` or ``pytorch_lightning``).

The callback watches the ``LightningModule`` when fit starts, closes one gradwatch
step per optimizer step (with ``accumulate_grad_batches=2`` two batches make one
step, as in the Trainer's ``global_step``), one epoch at each training epoch's end,
and ends the run when fit ends (``finished``) or fails (``crashed``). A fit resumed
from a checkpoint (``fit(ckpt_path=...)``) closes its steps where the restored
``global_step`` moves, so its first step is its first whole window; its records are
a run of their own, numbered from step 0 (not from the checkpoint's
``global_step``). Under a DDP strategy the process group is up when fit starts, so
each rank reports as its own rank of one run (``watch()`` reads rank and world size
from ``torch.distributed``). Under ``precision="16-mixed"`` the
precision plugin's GradScaler goes to ``watch(scaler=)`` (unless the callback was
given one): backward leaves the gradients multiplied by the loss scale, and the
scaler skips the steps that overflow.

Example:
    >>> import lightning as L  # doctest: +SKIP
    >>> from gradwatch.integrations.lightning import GradwatchCallback  # doctest: +SKIP
    >>> callback = GradwatchCallback(run="mnist", server="ws://127.0.0.1:8765")  # doctest: +SKIP
    >>> L.Trainer(max_epochs=3, callbacks=[callback]).fit(model, loader)  # doctest: +SKIP
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

try:  # the unified package first; the standalone one is the same API
    from lightning.pytorch import Callback
except ImportError:  # pragma: no cover - exercised where only pytorch_lightning is installed
    try:
        from pytorch_lightning import Callback  # type: ignore[assignment]
    except ImportError as e:
        raise ImportError(
            "gradwatch.integrations.lightning needs Lightning: "
            "pip install 'gradwatch[lightning]' (or lightning / pytorch_lightning)"
        ) from e

from gradwatch.trainer_hooks import Monitor, watch
from gradwatch.trainer_hooks.quantities.params import scale_tensor


def _loss_of(outputs: Any) -> torch.Tensor | None:
    """The loss a ``training_step`` returned: a tensor, or a mapping's ``"loss"``."""
    if isinstance(outputs, torch.Tensor):
        return outputs
    if isinstance(outputs, dict):
        loss = outputs.get("loss")
        return loss if isinstance(loss, torch.Tensor) else None
    return None


class GradwatchCallback(Callback):
    """Monitor a Lightning fit with gradwatch: ``Trainer(callbacks=[GradwatchCallback()])``.

    Args:
        run: the run's name in the dashboard.
        server: ``ws://host:port`` of a gradwatch server, or None to record a spool.
        spool: the spool file (see :func:`gradwatch.trainer_hooks.watch`).
        **watch_options: any other :func:`~gradwatch.trainer_hooks.watch` keyword
            (``every``, ``overhead``, ``token``, ``profile``, ``diagnose``, ...).

    The step's loss is the mean of the accumulated batches' losses, the short last
    window of an epoch included (Lightning divides each batch's loss by
    ``accumulate_grad_batches`` before backward, however many batches the window has:
    the callback sums them in float32 and scales the sum by ``accumulate_grad_batches``
    over the window's batches). Under manual optimization it is the sum of what the
    window's ``training_step`` calls returned; one that returns nothing counts the
    loss its one backward ran from (unscaled under 16-mixed), and a batch of several
    backward passes (a GAN's) then none. It stays a tensor: nothing here waits for the
    device.

    Example:
        >>> cb = GradwatchCallback(run="demo", spool="run.jsonl", every=4)
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
        super().__init__()
        self.run = run
        self.server = server
        self.spool = spool
        self.watch_options = watch_options
        self.monitor: Monitor | None = None
        self._loss: torch.Tensor | None = None
        self._graph: torch.Tensor | None = None  # the loss backward ran from, with its graph
        self._batches = 0  # the batches whose losses are in self._loss
        self._global_step = 0  # the Trainer's global_step when the current batch started
        # the current batch's backward passes, and the loss of the last (detached, float32,
        # unscaled): a manual-optimization batch that returns no loss is recorded with it
        self._backwards = 0
        self._backward_loss: torch.Tensor | None = None
        self._scaler: Any = None  # the precision plugin's GradScaler (16-mixed), if any

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        if self.monitor is not None and not self.monitor.closed:
            return  # a second fit on the same callback goes on in the same run
        spool = self.spool
        if spool is not None and int(getattr(trainer, "world_size", 1)) > 1:
            # one file per rank: ranks writing one spool would interleave their lines
            path = os.fspath(spool)
            stem, dot, ext = path.rpartition(".") if "." in os.path.basename(path) else (
                path, "", "")
            spool = f"{stem}-rank{int(trainer.global_rank)}{dot}{ext}"
        options = dict(self.watch_options)
        # 16-mixed: backward leaves gradients multiplied by the loss scale (65536 at
        # first), and the plugin's GradScaler skips the steps that overflow
        scaler = getattr(getattr(trainer, "precision_plugin", None), "scaler", None)
        self._scaler = scaler
        if scaler is not None:
            options.setdefault("scaler", scaler)
        self.monitor = watch(pl_module, run=self.run, server=self.server, spool=spool, **options)
        # no global_step baseline here: a checkpoint's training state is restored after
        # on_fit_start, and global_step jumps then (on_train_batch_start reads it)
        self._loss = None
        self._graph = None
        self._batches = 0

    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        # the optimizer steps between this hook and on_train_batch_end: a step closes
        # exactly when this batch moved global_step, whatever it was before (a resumed
        # checkpoint's, a second fit's)
        started = time.perf_counter()
        self._global_step = int(trainer.global_step)
        self._backwards = 0
        self._backward_loss = None
        if self.monitor is not None:  # what the callback costs counts in `overhead`
            self.monitor.charge(time.perf_counter() - started)

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: torch.Tensor) -> None:
        # The loss with its autograd graph (the batch's ``outputs`` only has a detached
        # copy): the graph's size and the stale-state and kept-loss checks read it. Under
        # 16-mixed it is the scaled loss, one node more than the loss, every step alike.
        monitor = self.monitor
        if monitor is not None:
            started = time.perf_counter()
            self._graph = loss
            self._backwards += 1
            if not getattr(pl_module, "automatic_optimization", True):
                # kept now: the optimizer step inside training_step may change the scale
                # before the batch ends. Automatic optimization returns its loss: no work.
                kept = loss.detach().float()
                scale = scale_tensor(self._scaler)
                self._backward_loss = kept / scale if scale is not None else kept
            monitor.charge(time.perf_counter() - started)

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        monitor = self.monitor
        if monitor is None:
            return
        started = time.perf_counter()
        loss = _loss_of(outputs)
        if (loss is None and self._backwards == 1
                and not getattr(pl_module, "automatic_optimization", True)):
            # manual optimization whose training_step returns nothing: the loss its one
            # backward ran from (several, a GAN's two losses: none of them is the step's)
            loss = self._backward_loss
        if loss is not None:
            # float32: a bf16 loss summed in bf16 loses 0.1-0.3 % over a window
            loss = loss.detach().float()
            self._loss = loss if self._loss is None else self._loss + loss
            self._batches += 1
        # global_step counts optimizer steps: it moves once per accumulated window
        closes = int(trainer.global_step) != self._global_step
        if closes:
            loss, graph = self._window_mean(trainer, pl_module), self._graph
            self._loss = self._graph = None
            self._batches = 0
        monitor.charge(time.perf_counter() - started)
        if closes:
            monitor.step(loss, graph=graph)

    def _window_mean(self, trainer: Any, pl_module: Any) -> torch.Tensor | None:
        """The mean of the window's batch losses, from the sum of what Lightning returned."""
        loss, batches = self._loss, self._batches
        accumulate = int(getattr(trainer, "accumulate_grad_batches", 1))
        # Automatic optimization divides every batch's loss by accumulate_grad_batches,
        # also in an epoch's short last window: its k batches sum to k/N of their mean.
        # (Manual optimization divides nothing: the sum is what the module returned.)
        if (loss is not None and getattr(pl_module, "automatic_optimization", True)
                and 0 < batches != accumulate):
            loss = loss * (accumulate / batches)
        return loss

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if self.monitor is not None:
            self.monitor.epoch()

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self._close("finished")

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._close("crashed")

    def _close(self, status: str) -> None:
        if self.monitor is not None and not self.monitor.closed:
            self.monitor.close(status=status)
