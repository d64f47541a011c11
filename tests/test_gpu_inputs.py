"""Large CUDA inputs are drawn on the device: deterministic per seed, fresh per seed, on the device."""

import pytest
import torch

from mini_kv.references.common import DEVICE_RANDOM_NUMEL, values


def _draw(seed: int) -> torch.Tensor:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    return values((DEVICE_RANDOM_NUMEL,), torch.float16, "cuda", gen)


@pytest.mark.gpu
def test_large_cuda_values_are_deterministic_per_seed_and_on_the_device():
    a, b, c = _draw(1), _draw(1), _draw(2)
    assert a.is_cuda and a.dtype == torch.float16 and a.shape == (DEVICE_RANDOM_NUMEL,)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert abs(a.float().mean().item()) < 0.01 and abs(a.float().std().item() - 1) < 0.01


def test_small_and_cpu_values_come_from_the_cpu_stream():
    gen = torch.Generator(device="cpu").manual_seed(3)
    got = values((1000,), torch.float32, "cpu", gen)
    want = torch.randn((1000,), generator=torch.Generator(device="cpu").manual_seed(3))
    assert torch.equal(got, want)
