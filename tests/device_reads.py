"""What a GPU would wait for, counted on the CPU: the operations that read a device tensor's value on the host (a
tensor's item or truth, `tolist`, a boolean mask's indices, unique values, a histogram's size). On a GPU each makes
the host wait until the device has run everything queued before it, so the host can no longer queue work ahead.

On a CPU every tensor is on the host, so `DeviceReads` tells the device's tensors apart itself: the ones it is given
(e.g. a model's weights, a batch as copied to the device) and everything computed from them."""

from __future__ import annotations

from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

HOST_READS = {"aten.item", "aten._local_scalar_dense", "aten.is_nonzero", "aten.equal", "aten.nonzero",
              "aten.masked_select", "aten._unique", "aten._unique2", "aten.unique_dim", "aten.unique_consecutive",
              "aten.bincount"}


def reads_on_host(func, args) -> bool:
    """Whether the operation reads a value of its input on the host (on a GPU: waits for the device)."""
    name = str(func.overloadpacket)
    by_mask = name in ("aten.index", "aten.index_put", "aten.index_put_") and any(
        isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1] if i is not None)
    by_counts = func is torch.ops.aten.repeat_interleave.Tensor   # its output's size is read from the device
    return name in HOST_READS or by_mask or by_counts


def tensors_in(tree):
    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, (list, tuple)):
        for item in tree:
            yield from tensors_in(item)
    elif isinstance(tree, dict):
        yield from tensors_in(list(tree.values()))


class DeviceReads(TorchDispatchMode):
    """Counts the host's reads of device tensors (`reads`: where each came from). Device tensors: those given to
    `on_device`, and the outputs of every operation with one among its inputs. `Tensor.tolist` does not pass through
    torch's dispatch on a CPU, so the mode counts it itself while it is active."""

    def __init__(self, *device_tensors: torch.Tensor):
        super().__init__()
        self.device = WeakIdKeyDictionary()
        self.reads: Counter = Counter()
        self.on_device(*device_tensors)

    def on_device(self, *tensors: torch.Tensor) -> None:
        for t in tensors:
            self.device[t] = True

    def is_on_device(self, t: torch.Tensor) -> bool:
        return t in self.device

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        from_device = any(self.is_on_device(t) for t in tensors_in([args, kwargs]))
        if from_device and reads_on_host(func, args):
            self.reads[str(func.overloadpacket)] += 1
        out = func(*args, **kwargs)
        if from_device:
            written = [args[0]] if func._schema.is_mutable and isinstance(args[0], torch.Tensor) else []
            # a write into a view of a tensor (x[1:] += ...) puts device values into the tensor it views
            self.on_device(*tensors_in(out), *written, *(t._base for t in written if t._base is not None))
        return out

    def __enter__(self):
        self._tolist = torch.Tensor.tolist
        mode = self

        def tolist(t):
            if mode.is_on_device(t):
                mode.reads["tolist"] += 1
            return mode._tolist(t)
        torch.Tensor.tolist = tolist
        return super().__enter__()

    def __exit__(self, *exc):
        torch.Tensor.tolist = self._tolist
        return super().__exit__(*exc)


class DeviceWork(DeviceReads):
    """Counts (in `reads`) every operation on a device tensor but views, while no captured step runs (`captured`,
    raised by the caller around one): on a GPU each is a kernel launched from Python."""
    captured = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        view = not func._schema.is_mutable and any(r.alias_info is not None for r in func._schema.returns)
        if not (self.captured or view) and any(self.is_on_device(t) for t in tensors_in([args, kwargs or {}])):
            self.reads[str(func.overloadpacket)] += 1
        return super().__torch_dispatch__(func, types, args, kwargs)
