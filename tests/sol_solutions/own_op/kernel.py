import numpy as np
import torch


# a kernel of the solution's own (here NumPy's loops, registered as an operator so that the dispatcher
# names it), not one of torch's
@torch.library.custom_op("mini_kv_tests::scale_mul", mutates_args=())
def scale_mul(x: torch.Tensor, w: torch.Tensor, alpha: float) -> torch.Tensor:
    return torch.from_numpy(np.multiply(x.numpy(), w.numpy() * np.float32(alpha)))


@torch.library.custom_op("mini_kv_tests::total", mutates_args=())
def total(y: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(np.asarray(y.numpy().sum(dtype=np.float32)))


def run(x, w, alpha):
    y = scale_mul(x, w, float(alpha))
    return {"y": y, "total": total(y)}
