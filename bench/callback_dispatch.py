"""What Lightning's own dispatch of one more callback costs a training batch.

Lightning calls every callback's hook for each event, each inside a profiler context,
also where the callback does not override it. ``GradwatchCallback`` times its own hook
bodies and counts them in ``overhead`` (``Monitor.charge``); the dispatch around them
is left out. This times Lightning's dispatch of the six hooks of an
automatic-optimization batch (timeit, best of ``--repeat``) with the Trainer's
callbacks as they are and with an empty ``Callback`` added: the difference is what one
callback costs a batch before it does anything.

    .venv/bin/python bench/callback_dispatch.py
"""

from __future__ import annotations

import argparse
import logging
import timeit
import warnings
from typing import Any

import torch

warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
import lightning as L  # noqa: E402 (its import logs; quiet first)
from lightning.pytorch.trainer.call import _call_callback_hooks  # noqa: E402

#: the callback hooks of one automatic-optimization batch, with their extra arguments
BATCH_HOOKS = {"on_train_batch_start": 2, "on_before_backward": 1, "on_after_backward": 0,
               "on_before_optimizer_step": 1, "on_before_zero_grad": 1,
               "on_train_batch_end": 3}


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.layer(batch).square().mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> Any:
        return torch.utils.data.DataLoader(torch.randn(8, 4), batch_size=4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--number", type=int, default=3000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    trainer = L.Trainer(max_steps=2, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Tiny())  # the trainer holds its module after fit: hooks can be called

    def batch() -> None:
        for hook, extra in BATCH_HOOKS.items():
            _call_callback_hooks(trainer, hook, *([None] * extra))

    own = list(trainer.callbacks)
    for label, callbacks in (("as it is", own), ("an empty Callback added", [*own, L.Callback()]),
                             ("as it is", own), ("an empty Callback added", [*own, L.Callback()])):
        trainer.callbacks = callbacks
        best = min(timeit.repeat(batch, number=args.number, repeat=args.repeat)) / args.number
        print(f"{label}: {best * 1e6:.1f} µs a batch ({len(BATCH_HOOKS)} hooks)")


if __name__ == "__main__":
    main()
