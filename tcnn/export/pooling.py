"""The AOTInductor pooling rewrite: a ``ceil_mode`` max or average pooling as explicit padding and a floor-mode
pooling, the same windows and divisors (equal to float rounding), which AOTInductor computes right under a dynamic
size. ``tcnn.export.aoti`` compiles a copy of the model with its poolings rewritten; the model itself is untouched.
"""
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ['FloorModePool2d', 'floor_mode_pools']


class FloorModePool2d(nn.Module):
    """A ``ceil_mode`` max or average pooling as explicit padding and a floor-mode pooling: the same output (to float
    rounding), as AOTInductor computes it right under a dynamic size. AOTInductor in torch 2.15 sizes a ``ceil_mode``
    pooling's output by flooring when the input size is symbolic: at an odd size (5 px into ResNet-D's 2x2/2 shortcut
    pooling: 2 px out instead of 3) the rest of the network reads memory the package never wrote (garbage or NaN).

    Only for poolings whose last window never starts in the right padding (``padding <= kernel - stride``, e.g. 2x2/2
    unpadded, 3x3/2 padded by 1): PyTorch drops such a window, a rule that would make the output size depend on a
    comparison of sizes, which ``torch.export`` would turn into a guard."""

    def __init__(self, pool: nn.Module) -> None:
        super().__init__()
        self.is_max = isinstance(pool, nn.MaxPool2d)
        pair = nn.modules.utils._pair
        self.kernel, self.stride, self.padding = pair(pool.kernel_size), pair(pool.stride or pool.kernel_size), \
            pair(pool.padding)
        self.dilation = pair(pool.dilation) if self.is_max else (1, 1)
        self.count_include_pad = not self.is_max and pool.count_include_pad

    @staticmethod
    def replaces(pool: nn.Module) -> bool:
        """Whether ``pool`` is one this rewrite reproduces: a plain ``ceil_mode`` ``AvgPool2d``/``MaxPool2d`` without
        indices or a divisor override, whose last window never starts in the right padding."""
        if type(pool) not in (nn.AvgPool2d, nn.MaxPool2d) or not pool.ceil_mode:  # subclasses (timm's *Same) pad
            return False
        if isinstance(pool, nn.MaxPool2d) and pool.return_indices or \
                isinstance(pool, nn.AvgPool2d) and pool.divisor_override is not None:
            return False
        pair = nn.modules.utils._pair
        k, st, p = pair(pool.kernel_size), pair(pool.stride or pool.kernel_size), pair(pool.padding)
        d = pair(pool.dilation) if isinstance(pool, nn.MaxPool2d) else (1, 1)
        return all(p[i] <= d[i] * (k[i] - 1) + 1 - st[i] for i in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # ceil mode has ceil((L + 2p - k_eff) / s) + 1 windows: floor mode gets as many when the right end is padded by
        # p + e (e: the last window's reach past the right padding)
        pads, extensions = [], []
        for size, k, s, p, d in zip((x.shape[-1], x.shape[-2]), self.kernel[::-1], self.stride[::-1],
                                    self.padding[::-1], self.dilation[::-1]):
            k_eff = d * (k - 1) + 1
            windows = (size + 2 * p - k_eff + s - 1) // s + 1
            extension = (windows - 1) * s + k_eff - size - 2 * p
            pads += [p, p + extension]
            extensions += [0, extension]
        if self.is_max:
            return F.max_pool2d(F.pad(x, pads, value=float('-inf')), self.kernel, self.stride, 0, self.dilation)
        # each window's sum over the number of elements PyTorch counts there: the real ones, with count_include_pad
        # the padding's too, never the extension (a ceil-mode window counts only what input and padding cover)
        total = F.avg_pool2d(F.pad(x, pads), self.kernel, self.stride, 0, divisor_override=1)
        ones = x.new_ones((1, 1) + tuple(x.shape[-2:]))
        if self.count_include_pad:
            counted = F.pad(F.pad(ones, [pads[0], pads[0], pads[2], pads[2]], value=1.0), extensions)
        else:
            counted = F.pad(ones, pads)
        return total / F.avg_pool2d(counted, self.kernel, self.stride, 0, divisor_override=1)


def floor_mode_pools(model: nn.Module) -> nn.Module:
    """``model``, or a copy of it with its ``ceil_mode`` poolings in floor-mode form (``FloorModePool2d``)."""
    names = [name for name, m in model.named_modules() if FloorModePool2d.replaces(m)]
    if not names:
        return model
    model = copy.deepcopy(model)
    for name in names:
        parent, _, attr = name.rpartition('.')
        owner = model.get_submodule(parent) if parent else model
        setattr(owner, attr, FloorModePool2d(getattr(owner, attr)))
    return model
