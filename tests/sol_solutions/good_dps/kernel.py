import torch
from helpers.scale import scaled


@torch.no_grad()
def run(x, w, alpha, y, total):
    y.copy_(scaled(x, w, alpha))
    total.copy_(y.sum())
