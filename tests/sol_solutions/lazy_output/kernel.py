import torch


class Lazy(torch.Tensor):
    """A tensor subclass: it could compute (or change) its values only when they are read."""


def run(x, w, alpha):
    y = x * w * alpha
    return y.as_subclass(Lazy), y.sum()
