"""gradwatch's capture side: runs inside the training process.

Example:
    >>> from gradwatch.trainer_hooks import watch   # doctest: +SKIP
    >>> with watch(model, run="rotation-lstm", server=None, spool="run.jsonl") as monitor:
    ...     for x, y in loader:
    ...         loss = criterion(model(x), y)
    ...         optimizer.zero_grad(); loss.backward(); optimizer.step()
    ...         monitor.step(loss)
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
