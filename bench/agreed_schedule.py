"""What the ranks' agreement on heavy steps costs the training thread (trainer_hooks/agreed.py).

Two gloo ranks on CPU (start with ``torchrun``). Each step does ~2 ms of matmuls and
one small all-reduce on the default group (a stand-in for training, whose collectives
keep the ranks in step; the agreement's all-reduce runs on gloo's own thread
meanwhile), then asks an :class:`AgreedSchedule` and a plain budget :class:`Schedule`, fed the same
costs, whether the step is heavy, in alternating order (interleaved A/B in one
process). Reported per rank: the median and 95th percentile of ``capture()``'s wall
time (``perf_counter``) on the steps that start and read an agreement (every 16th) and
on the others, for both schedules, and the agreed schedule's extra cost per step.

Run: ``torchrun --standalone --nproc-per-node 2 bench/agreed_schedule.py [steps]``
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
import torch.distributed as dist

from gradwatch.trainer_hooks.agreed import AgreedSchedule
from gradwatch.trainer_hooks.schedule import Schedule


def main(steps: int) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    agreed, plain = AgreedSchedule(every=1, overhead=0.02), Schedule(every=1, overhead=0.02)
    times: dict[tuple[str, bool], list[float]] = {}
    a, b = torch.randn(96, 96), torch.randn(96, 96)
    for step in range(steps):
        started = time.perf_counter()
        while time.perf_counter() - started < 0.002:  # the "training step"
            a = (a @ b).tanh()
        dist.all_reduce(a[0, :4].contiguous())  # its collective
        at_agreement = step % AgreedSchedule.AGREE_EVERY == 0
        order = [("agreed", agreed), ("plain", plain)]
        for name, schedule in order if step % 2 else order[::-1]:
            t0 = time.perf_counter()
            heavy = schedule.capture(step)
            times.setdefault((name, at_agreement), []).append(time.perf_counter() - t0)
            schedule.observe(step, heavy, 0.0001, 0.0024 if heavy else 0.002)
    lines = [f"rank {rank}: {steps} steps, agreed interval {agreed.agreed}, "
             f"agreement failed: {agreed.failed}"]
    agreed.close()
    for (name, at), values in sorted(times.items()):
        q = statistics.quantiles(values, n=20)
        lines.append(f"  {name:6s} {'agreement' if at else 'other':9s} steps: median "
                     f"{statistics.median(values) * 1e6:6.1f} µs, p95 {q[-1] * 1e6:6.1f} µs "
                     f"(n={len(values)})")
    extra = sum(times[("agreed", True)]) + sum(times[("agreed", False)]) - sum(
        times[("plain", True)]) - sum(times[("plain", False)])
    lines.append(f"  agreed - plain: {extra / steps * 1e6:+.2f} µs per step (mean)")
    print("\n".join(lines), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3200)
