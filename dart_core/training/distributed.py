"""Data-parallel training through torch.distributed: what a process needs to know and do when `torchrun` started
several of them. One process per device; each loads its own copy of the target, computes its own shard of the
sequences and all-reduces the head's gradients (torch's DistributedDataParallel); rank 0 alone evaluates, writes
checkpoints and the head, and draws the progress bar. Without torchrun (WORLD_SIZE unset or 1) every helper here is
the single-process case and no process group exists.

gloo on a CPU, NCCL on GPUs (one GPU per process: cuda:LOCAL_RANK).
"""

from __future__ import annotations

import inspect
import os
from contextlib import contextmanager, nullcontext

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def launched_world_size() -> int:
    """The number of processes torchrun started (1 without torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def is_main() -> bool:
    return rank() == 0


def device_for(device: str) -> str:
    """This process's device: under torchrun each process takes its own GPU ('cuda' -> cuda:LOCAL_RANK)."""
    if device == "cuda" and launched_world_size() > 1:
        return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    return device


@contextmanager
def process_group(device: str):
    """The process group for the run, when torchrun started more than one process; torn down on the way out."""
    if launched_world_size() <= 1:
        yield
        return
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
    try:
        yield
        # both processes done before either tears its group down (a process torn down while the other still used the
        # group once aborted with "terminate called without an active exception")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def wrap(module: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """`module` under DistributedDataParallel when there are several processes (rank 0's weights are broadcast
    to all; each backward all-reduces the gradients, averaged); the module itself otherwise. The head's buffers
    (draft vocabulary, feature scales) never change while training, so they are not broadcast at every step."""
    if world_size() <= 1:
        return module
    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(module, device_ids=ids, **_NO_BUFFER_SYNC)


# synced once at construction, never per forward (the argument's name changed in torch 2.13)
_NO_BUFFER_SYNC = ({"forward_sync_buffers": False}
                   if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
                   else {"broadcast_buffers": False})


def no_sync(model: torch.nn.Module, sync: bool):
    """Accumulate gradients locally (no all-reduce) unless `sync`: only a step's last backward needs one."""
    return nullcontext() if sync or not isinstance(model, DistributedDataParallel) else model.no_sync()


def summed(values: torch.Tensor) -> torch.Tensor:
    """`values` summed over all processes (a small float tensor, e.g. a step's token count and loss)."""
    if world_size() <= 1:
        return values
    out = values.to(_collective_device(), copy=True)
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out.to(values.device)


def all_agree(flag: bool) -> bool:
    """True when every process says True: whether to go on must be decided together, or one process would wait
    forever in a collective the others never reach (e.g. a time limit read on different clocks)."""
    if world_size() <= 1:
        return flag
    value = torch.tensor([1.0 if flag else 0.0], device=_collective_device())
    dist.all_reduce(value, op=dist.ReduceOp.MIN)
    return bool(value.item() > 0)


def _collective_device() -> torch.device:
    """Where a collective's tensor must live: NCCL reduces only GPU tensors, gloo CPU ones."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def barrier() -> None:
    if world_size() > 1:
        dist.barrier()
