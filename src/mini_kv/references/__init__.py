"""PyTorch references and input factories for the shipped operators.

Factory contract: `make_inputs(params, dtype, device, generator) -> tuple` of op arguments.
Reference contract: `reference(*args) -> Tensor`, the semantics the candidate must match; it must
also accept float64 inputs so the verifier can measure the reference's own error.
"""
