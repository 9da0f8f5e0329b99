"""gradwatch's capture side: runs inside the training process.

Example (a training loop writing to a spool file; ``server=`` streams it live):
    >>> import tempfile, torch
    >>> from gradwatch.protocol import read_spool
    >>> from gradwatch.trainer_hooks import watch
    >>> model = torch.nn.LSTM(3, 4)
    >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> spool = tempfile.mkdtemp() + "/run.jsonl"
    >>> with watch(model, run="doc-lstm", server=None, spool=spool) as monitor:
    ...     for _ in range(3):
    ...         out, _ = model(torch.randn(6, 2, 3))
    ...         loss = out.square().mean()
    ...         optimizer.zero_grad(); loss.backward(); optimizer.step()
    ...         monitor.step(loss)
    >>> [r["step"] for m in read_spool(spool) if m["type"] == "batch"
    ...  for r in m["records"] if r["kind"] == "step"]
    [0, 1, 2]
"""

try:
    import torch  # noqa: F401
except ImportError as e:  # pragma: no cover - exercised only without torch
    raise ImportError(
        "gradwatch.trainer_hooks runs inside your training process and needs PyTorch, "
        "which is not installed here. Install your own torch first "
        "(for example `pip install torch`), then `pip install gradwatch`. "
        "The server alone needs no torch: `pip install 'gradwatch[server]'`."
    ) from e

from .attach import watch
from .monitor import Monitor
from .warn import GradwatchWarning

__all__ = ["GradwatchWarning", "Monitor", "watch"]
