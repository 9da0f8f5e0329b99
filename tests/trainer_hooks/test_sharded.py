"""What sharded.py decides without a process group: which tensors are DTensors, and
that asking does not import torch.distributed.tensor (~0.45 s) for everyone."""

from __future__ import annotations

import subprocess
import sys

import torch

from gradwatch.trainer_hooks.quantities.sharded import is_sharded, local_part, reduce_groups


def test_importing_the_trainer_side_leaves_torch_distributed_tensor_unimported() -> None:
    code = (
        "import sys, torch\n"
        "from gradwatch.trainer_hooks import watch\n"
        "monitor = watch(torch.nn.LSTM(2, 3), run='x', spool='/dev/null', quiet=True)\n"
        "monitor.close()\n"
        "print('torch.distributed.tensor' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stdout.strip() == "False"


def test_plain_tensors_are_not_sharded_and_a_dtensor_is() -> None:
    plain = torch.ones(4)
    assert not is_sharded(plain) and not is_sharded(torch.nn.Parameter(plain))
    assert not is_sharded(None) and not is_sharded([plain])
    assert local_part(plain) is plain and reduce_groups(plain) == ()
    # once torch.distributed.tensor is loaded (as fully_shard loads it), a DTensor on a
    # one-rank mesh is one, replicated: nothing to reduce over
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, distribute_tensor

    started = not dist.is_initialized()
    if started:
        # an in-process store: no port, no other process
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        shared = distribute_tensor(torch.arange(4.0), mesh, [Replicate()])
        assert is_sharded(shared) and not is_sharded(plain)
        assert torch.equal(local_part(shared), torch.arange(4.0))
        assert reduce_groups(shared) == ()
    finally:
        if started:
            dist.destroy_process_group()
