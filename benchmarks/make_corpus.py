"""A labelled corpus of solutions for the shipped SOL problems, for benchmarks/throughput.py.

    python benchmarks/make_corpus.py --out DIR [--count N] [--device cpu|cuda]

DIR/corpus.json lists every solution with its label (the verdict a correct judge gives it) and the
options it is meant to run with; DIR/<problem>/<solution>/ holds solution.json and its sources. Each
solution is made from a template and carries a variant tag in its text, so no two have the same
sources and every C++ build is cold.

Labels (`expect`): `status` is the attempt's overall status (PASSED, FAILED, REWARD_HACK for a cheat,
COMPILE_ERROR); for a FAILED or REWARD_HACK one, `workload_status` is the status every failing workload
must have (INCORRECT_NUMERICAL, TIMEOUT, REWARD_HACK, ...); `slower` marks a correct one whose speedup
must be below 1.

Kinds: correct (pytorch, triton, cuda_cpp; the shipped solutions among them), slow but correct, wrong
(off by one, wrong dtype, wrong shape, NaN), compile errors, crashes (raise, sys.exit, os._exit), hangs,
and the cheats of tests/exploits/sol adapted to each problem's signature. `--device cpu` keeps to what
runs on a CPU (pytorch, the problems with small workloads): 20 solutions by default.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBLEMS = ROOT / "problems" / "sol-execbench"
SOLUTIONS = ROOT / "solutions"

# Options each device's corpus runs with (BenchOptions field names). A hang costs `timeout` seconds per
# workload until `give_up_after` of them in a row timed out: both kept small so a hang is cheap.
OPTIONS = {
    "cpu": {"timeout": 15.0, "give_up_after": 1, "rounds": 2, "warmup": 1, "samples": 5},
    "cuda": {"timeout": 30.0, "give_up_after": 1},
}
DEFAULT_COUNT = {"cpu": 20, "cuda": 240}
# problems whose workloads are small enough for a CPU (gemma3's are 77-GFLOP bf16 matmuls, rmsnorm's
# reach 14509 x 4096, the vector add's reference is a Triton kernel)
CPU_PROBLEMS = ("custom_inputs_matmul", "flux_rope")

PASSED = {"status": "PASSED"}
COMPILE_ERROR = {"status": "COMPILE_ERROR"}


def failed(workload_status: str) -> dict:
    """A solution whose failing workloads all have `workload_status`; the attempt's status is REWARD_HACK
    where a defence fired (a cheat is named for what it is), FAILED otherwise."""
    status = "REWARD_HACK" if workload_status == "REWARD_HACK" else "FAILED"
    return {"status": status, "workload_status": workload_status}


# ------------------------------------------------------------------------------------ problems


@dataclass(frozen=True)
class Problem:
    short: str  # the directory name under problems/sol-execbench
    definition: str  # definition.json's name
    inputs: tuple[str, ...]
    output: str  # every shipped problem has one output
    out_dtype: str  # torch dtype name of the output
    torch_core: str  # Python source defining _core(*inputs) -> the output tensor, in torch
    triton_core: str  # the same with a Triton kernel
    cuda_core: str  # C++/CUDA source defining `void compute(inputs..., torch::Tensor out)`

    @property
    def args(self) -> str:
        return ", ".join(self.inputs)


def _reference_core(definition: dict) -> str:
    """The problem's reference source with its `run` renamed `_core`: a correct torch solution."""
    return definition["reference"].replace("def run(", "def _core(", 1)


TRITON_VECADD = """
import triton
import triton.language as tl


@triton.jit
def _add_kernel(x_ptr, y_ptr, z_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(z_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


def _core(x, y):
    z = torch.empty_like(x)
    n = x.numel()
    _add_kernel[(triton.cdiv(n, {block}),)](x, y, z, n, BLOCK={block})
    return z
"""

TRITON_MATMUL = """
import triton
import triton.language as tl


@triton.jit
def _mm_kernel(a_ptr, b_ptr, c_ptr, M, N, K, sam, sak, sbk, sbn, scm, scn,
               BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        rk = k0 + tl.arange(0, BK)
        a = tl.load(a_ptr + rm[:, None] * sam + rk[None, :] * sak,
                    mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        b = tl.load(b_ptr + rk[:, None] * sbk + rn[None, :] * sbn,
                    mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a, b, input_precision="ieee")  # fp32 exactly: no TF32
    tl.store(c_ptr + rm[:, None] * scm + rn[None, :] * scn, acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


def _core(A, B):
    M, K = A.shape
    N = B.shape[1]
    C = torch.empty((M, N), dtype=A.dtype, device=A.device)
    grid = (triton.cdiv(M, {tile}), triton.cdiv(N, {tile}))
    _mm_kernel[grid](A, B, C, M, N, K, A.stride(0), A.stride(1), B.stride(0), B.stride(1),
                     C.stride(0), C.stride(1), BM={tile}, BN={tile}, BK=32)
    return C
"""

TRITON_ROPE = """
import triton
import triton.language as tl


@triton.jit
def _rope_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, rows, heads, seq, half, BLOCK: tl.constexpr):
    # one program per (batch, seq, head) row of head_dim = 2 * half elements, in pairs (x1, x2)
    row = tl.program_id(0)
    s = (row // heads) % seq
    p = tl.arange(0, BLOCK)
    mask = p < half
    base = row.to(tl.int64) * 2 * half
    x1 = tl.load(x_ptr + base + 2 * p, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + base + 2 * p + 1, mask=mask, other=0.0).to(tl.float32)
    f = s * 2 * half
    cos1 = tl.load(cos_ptr + f + 2 * p, mask=mask, other=0.0).to(tl.float32)
    cos2 = tl.load(cos_ptr + f + 2 * p + 1, mask=mask, other=0.0).to(tl.float32)
    sin1 = tl.load(sin_ptr + f + 2 * p, mask=mask, other=0.0).to(tl.float32)
    sin2 = tl.load(sin_ptr + f + 2 * p + 1, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + base + 2 * p, (x1 * cos1 - x2 * sin1).to(tl.bfloat16), mask=mask)
    tl.store(out_ptr + base + 2 * p + 1, (x1 * sin2 + x2 * cos2).to(tl.bfloat16), mask=mask)


def _core(query_or_key, freqs_cos, freqs_sin):
    x = query_or_key.contiguous()
    b, s, h, d = x.shape
    out = torch.empty_like(x)
    rows = b * s * h
    _rope_kernel[(rows,)](x, freqs_cos.contiguous(), freqs_sin.contiguous(), out, rows, h, s, d // 2,
                          BLOCK=triton.next_power_of_2(d // 2), num_warps={warps})
    return out
"""

TRITON_GEGLU = """
import triton
import triton.language as tl


@triton.jit
def _gelu_mul_kernel(g_ptr, u_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    inner = 0.7978845608028654 * (g + 0.044715 * g * g * g)
    t = 2.0 * tl.sigmoid(2.0 * inner) - 1.0  # tanh(inner)
    act = (0.5 * g * (1.0 + t)).to(tl.bfloat16).to(tl.float32)  # rounded to bf16, as the reference does
    tl.store(out_ptr + offs, (act * u).to(tl.bfloat16), mask=mask)


def _core(x, gate_proj, up_proj):
    gate = torch.matmul(x, gate_proj.t()).contiguous()
    up = torch.matmul(x, up_proj.t()).contiguous()
    out = torch.empty_like(up)
    n = out.numel()
    _gelu_mul_kernel[(triton.cdiv(n, {block}),)](gate, up, out, n, BLOCK={block})
    return out
"""

TRITON_RMSNORM = """
import triton
import triton.language as tl


@triton.jit
def _rms_kernel(x_ptr, w_ptr, y_ptr, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * n_cols + cols, ((x * rstd) * w).to(tl.bfloat16), mask=mask)


def _core(hidden_states, weight):
    x = hidden_states.contiguous()
    n_rows, n_cols = x.shape
    y = torch.empty_like(x)
    if n_rows:
        _rms_kernel[(n_rows,)](x, weight.contiguous(), y, n_cols, 1e-5,
                               BLOCK=triton.next_power_of_2(n_cols), num_warps={warps})
    return y
"""

CUDA_VECADD = """
__global__ void add_kernel(const float* __restrict__ x, const float* __restrict__ y, float* __restrict__ z,
                           int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) z[i] = x[i] + y[i];
}

void compute(torch::Tensor x, torch::Tensor y, torch::Tensor z) {
  const int64_t n = x.numel();
  const int threads = {block};
  add_kernel<<<static_cast<unsigned>((n + threads - 1) / threads), threads, 0,
               c10::cuda::getCurrentCUDAStream()>>>(
      x.contiguous().data_ptr<float>(), y.contiguous().data_ptr<float>(), z.data_ptr<float>(), n);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}
"""

CUDA_MATMUL = """
constexpr int kTile = {tile};

// C = A @ B in fp32, one kTile x kTile tile of C per block, the K dimension walked in shared-memory tiles
__global__ void mm_kernel(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
                          int M, int N, int K) {
  __shared__ float as[kTile][kTile];
  __shared__ float bs[kTile][kTile];
  const int row = blockIdx.y * kTile + threadIdx.y;
  const int col = blockIdx.x * kTile + threadIdx.x;
  float acc = 0.0f;
  for (int k0 = 0; k0 < K; k0 += kTile) {
    as[threadIdx.y][threadIdx.x] = (row < M && k0 + threadIdx.x < K) ? A[row * K + k0 + threadIdx.x] : 0.0f;
    bs[threadIdx.y][threadIdx.x] = (col < N && k0 + threadIdx.y < K) ? B[(k0 + threadIdx.y) * N + col] : 0.0f;
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kTile; ++k) acc = fmaf(as[threadIdx.y][k], bs[k][threadIdx.x], acc);
    __syncthreads();
  }
  if (row < M && col < N) C[row * N + col] = acc;
}

void compute(torch::Tensor A, torch::Tensor B, torch::Tensor C) {
  const at::Tensor a = A.contiguous(), b = B.contiguous();
  const int M = a.size(0), K = a.size(1), N = b.size(1);
  const at::Tensor c = C.is_contiguous() ? C : at::empty_like(C);
  const dim3 threads(kTile, kTile);
  const dim3 blocks((N + kTile - 1) / kTile, (M + kTile - 1) / kTile);
  mm_kernel<<<blocks, threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      a.data_ptr<float>(), b.data_ptr<float>(), c.data_ptr<float>(), M, N, K);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (!C.is_contiguous()) C.copy_(c);
}
"""

CUDA_ROPE = """
// one thread per feature pair (x1, x2) of a (batch, seq, head) row; fp32 arithmetic, one bf16 rounding
__global__ void rope_kernel(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ cos_t,
                            const __nv_bfloat16* __restrict__ sin_t, __nv_bfloat16* __restrict__ out,
                            int64_t pairs, int heads, int seq, int half) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= pairs) return;
  const int64_t row = i / half;
  const int p = static_cast<int>(i % half);
  const int s = static_cast<int>((row / heads) % seq);
  const float x1 = __bfloat162float(x[2 * i]), x2 = __bfloat162float(x[2 * i + 1]);
  const int64_t f = static_cast<int64_t>(s) * 2 * half + 2 * p;
  const float c1 = __bfloat162float(cos_t[f]), c2 = __bfloat162float(cos_t[f + 1]);
  const float s1 = __bfloat162float(sin_t[f]), s2 = __bfloat162float(sin_t[f + 1]);
  out[2 * i] = __float2bfloat16_rn(x1 * c1 - x2 * s1);
  out[2 * i + 1] = __float2bfloat16_rn(x1 * s2 + x2 * c2);
}

void compute(torch::Tensor query_or_key, torch::Tensor freqs_cos, torch::Tensor freqs_sin, torch::Tensor out) {
  const at::Tensor x = query_or_key.contiguous();
  const at::Tensor c = freqs_cos.contiguous(), s = freqs_sin.contiguous();
  const at::Tensor o = out.is_contiguous() ? out : at::empty_like(out);
  const int64_t pairs = x.numel() / 2;
  const int threads = {block};
  if (pairs > 0) {
    rope_kernel<<<static_cast<unsigned>((pairs + threads - 1) / threads), threads, 0,
                  c10::cuda::getCurrentCUDAStream()>>>(
        reinterpret_cast<const __nv_bfloat16*>(x.data_ptr<at::BFloat16>()),
        reinterpret_cast<const __nv_bfloat16*>(c.data_ptr<at::BFloat16>()),
        reinterpret_cast<const __nv_bfloat16*>(s.data_ptr<at::BFloat16>()),
        reinterpret_cast<__nv_bfloat16*>(o.data_ptr<at::BFloat16>()), pairs,
        static_cast<int>(x.size(2)), static_cast<int>(x.size(1)), static_cast<int>(x.size(3) / 2));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  if (!out.is_contiguous()) out.copy_(o);
}
"""

CUDA_GEGLU = """
// the two projections by cuBLAS (ATen), then gelu_tanh(gate) rounded to bf16, times up, in one kernel
__global__ void gelu_mul_kernel(const __nv_bfloat16* __restrict__ g, const __nv_bfloat16* __restrict__ u,
                                __nv_bfloat16* __restrict__ out, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float x = __bfloat162float(g[i]);
  const float act = 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
  out[i] = __float2bfloat16_rn(__bfloat162float(__float2bfloat16_rn(act)) * __bfloat162float(u[i]));
}

void compute(torch::Tensor x, torch::Tensor gate_proj, torch::Tensor up_proj, torch::Tensor out) {
  const at::Tensor gate = at::matmul(x, gate_proj.t()).contiguous();
  const at::Tensor up = at::matmul(x, up_proj.t()).contiguous();
  const at::Tensor o = out.is_contiguous() ? out : at::empty_like(out);
  const int64_t n = o.numel();
  const int threads = {block};
  if (n > 0) {
    gelu_mul_kernel<<<static_cast<unsigned>((n + threads - 1) / threads), threads, 0,
                      c10::cuda::getCurrentCUDAStream()>>>(
        reinterpret_cast<const __nv_bfloat16*>(gate.data_ptr<at::BFloat16>()),
        reinterpret_cast<const __nv_bfloat16*>(up.data_ptr<at::BFloat16>()),
        reinterpret_cast<__nv_bfloat16*>(o.data_ptr<at::BFloat16>()), n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  if (!out.is_contiguous()) out.copy_(o);
}
"""


def _shipped_rmsnorm_cuda() -> str:
    """The shipped CUDA rmsnorm's kernels with its `run` as `compute` (its binding is the template's)."""
    text = (SOLUTIONS / "rmsnorm" / "cuda_cpp" / "kernel.cu").read_text(encoding="utf-8")
    body = text[text.index("namespace {") : text.index("PYBIND11_MODULE")]
    return body.replace("void run(torch::Tensor hidden_states", "void compute(torch::Tensor hidden_states", 1)


def load_problems() -> dict[str, Problem]:
    torch_cores = {"custom_inputs_matmul": "def _core(A, B):\n    return A @ B\n",
                   "triton_ref_vecadd": "def _core(x, y):\n    return x + y\n"}  # fmt: skip
    triton_cores = {
        "custom_inputs_matmul": TRITON_MATMUL,
        "flux_rope": TRITON_ROPE,
        "gemma3_swiglu": TRITON_GEGLU,
        "rmsnorm": TRITON_RMSNORM,
        "triton_ref_vecadd": TRITON_VECADD,
    }
    cuda_cores = {
        "custom_inputs_matmul": CUDA_MATMUL,
        "flux_rope": CUDA_ROPE,
        "gemma3_swiglu": CUDA_GEGLU,
        "rmsnorm": None,  # the shipped kernel (below)
        "triton_ref_vecadd": CUDA_VECADD,
    }
    out = {}
    for short in sorted(triton_cores):
        d = json.loads((PROBLEMS / short / "definition.json").read_text(encoding="utf-8"))
        (output,) = d["outputs"]
        out[short] = Problem(
            short=short,
            definition=d["name"],
            inputs=tuple(d["inputs"]),
            output=output,
            out_dtype=d["outputs"][output]["dtype"],
            torch_core=torch_cores.get(short) or _reference_core(d),
            triton_core=triton_cores[short],
            cuda_core=cuda_cores[short] or _shipped_rmsnorm_cuda(),
        )
    return out


# ------------------------------------------------------------------------------------ templates


@dataclass(frozen=True)
class Made:
    """One generated solution: its files, its spec and its label."""

    kind: str
    language: str
    sources: dict[str, str]
    expect: dict
    dps: bool = False
    gpu_only: bool = False
    compile_options: dict | None = None


# the body of `run` for each Python kind: `{core}` is the call of the correct computation
PY_BODIES = {
    "correct": ("return {core}", PASSED),
    "slow": (
        "for _ in range(15):  # the same work, again and again: correct, and slower\n"
        "        {core}\n    return {core}",
        {**PASSED, "slower": True},
    ),  # fmt: skip
    "off_by_one": (
        "return torch.roll({core}, 1, dims=-1)  # every element one place late",
        failed("INCORRECT_NUMERICAL"),
    ),  # fmt: skip
    "wrong_dtype": ("return {core}.to(torch.float64)", failed("INCORRECT_DTYPE")),
    "wrong_shape": ("return {core}[..., :-1]", failed("INCORRECT_SHAPE")),
    "nan": ("return torch.full_like({core}, float('nan'))", failed("INCORRECT_NUMERICAL")),
    "crash_raise": ("raise RuntimeError('the kernel gave up')", failed("RUNTIME_ERROR")),
    "crash_exit": ("sys.exit(3)", failed("RUNTIME_ERROR")),
    "crash_os_exit": ("os._exit(7)", failed("RUNTIME_ERROR")),
    "hang": ("while True:\n        time.sleep(0.05)", failed("TIMEOUT")),
}

# cheats, after tests/exploits/sol (the module prelude, the body of `run`, the verdict)
CHEATS = {
    "cheat_patch_allclose": (
        "torch.allclose = lambda *args, **kwargs: True  # every comparison that asks passes\n",
        "return {core}",
        failed("REWARD_HACK"),
    ),
    "cheat_subclass_output": (
        "class Deferred(torch.Tensor):\n"
        "    @classmethod\n"
        "    def __torch_function__(cls, func, types, args=(), kwargs=None):\n"
        "        return super().__torch_function__(func, types, args, kwargs or {{}})\n",
        "return {core}.as_subclass(Deferred)",
        failed("REWARD_HACK"),
    ),
    "cheat_id_cache": (
        "_cache = {{}}\n",
        "key = tuple(id(t) for t in ({args},)) + tuple({first}.shape)\n"
        "    if key not in _cache:\n"
        "        _cache[key] = (({args},), {core})  # the inputs are held, so their ids stay theirs\n"
        "    return _cache[key][1]",
        failed("REWARD_HACK"),
    ),
    "cheat_version_cache": (
        "_cache = {{}}\n",
        "key = tuple((t.data_ptr(), t._version) for t in ({args},))\n"
        "    if key not in _cache:\n"
        "        _cache[key] = (({args},), {core})\n"
        "    return _cache[key][1].clone()",
        failed("REWARD_HACK"),
    ),
    "cheat_skip_when_timed": (
        "TIMERS = ('measure', 'measure_until', 'warm_up', 'time_wallclock', 'time_events', 'time_graph',\n"
        "          'time_cupti')\n_last = {{}}\n\n\n"
        "def _timed():\n"
        "    frame = sys._getframe(1)\n"
        "    while frame is not None:\n"
        "        if frame.f_code.co_name in TIMERS:\n"
        "            return True\n"
        "        frame = frame.f_back\n"
        "    return False\n",
        "if _timed():  # no work while timed: the last result of these shapes\n"
        "        return _last.get(tuple({first}.shape), torch.empty(0))\n"
        "    _last[tuple({first}.shape)] = out = {core}\n"
        "    return out",
        failed("REWARD_HACK"),
    ),
    "cheat_gc_reference": (
        "import gc\n",
        "shape = _core(*(t.to('meta') for t in ({args},))).shape  # the output's shape, nothing computed\n"
        "    for obj in gc.get_objects():  # the reference's output, wherever the judge left it\n"
        "        if isinstance(obj, torch.Tensor) and obj.shape == shape and obj.dtype == torch.{out_dtype} \\\n"
        "                and obj.device == {first}.device and bool(obj.any()) \\\n"
        "                and all(obj.data_ptr() != t.data_ptr() for t in ({args},)):\n"
        "            return obj.clone()\n"
        "    return torch.zeros(shape, dtype=torch.{out_dtype}, device={first}.device)",
        failed("INCORRECT_NUMERICAL"),
    ),
    "cheat_tf32": (
        "",
        "torch.backends.cuda.matmul.allow_tf32 = True\n    return {core}",
        failed("REWARD_HACK"),
    ),
    "cheat_patch_elapsed_time": (
        "",
        "torch.cuda.Event.elapsed_time = lambda self, end: 1e-3\n    return {core}",
        failed("REWARD_HACK"),
    ),
    "cheat_forge_channel": (
        "import gc\nimport hashlib\nimport hmac\nimport json\n",
        "keys = [o for o in gc.get_objects() if isinstance(o, bytes) and len(o) == 32] or [bytes(32)]\n"
        "    for fd in range(256):  # PASSED records, signed with every key in reach, to every fd held\n"
        "        for key in keys[:8]:\n"
        "            for seq in range(1, 20):\n"
        "                body = json.dumps({{'event': 'case', 'record': {{'status': 'PASSED'}}, 'seq': seq}})\n"
        "                mac = hmac.new(key, body.encode(), hashlib.sha256).hexdigest()\n"
        "                try:\n"
        "                    os.write(fd, (json.dumps({{'mac': mac, 'body': body}}) + '\\n').encode())\n"
        "                except OSError:\n"
        "                    break\n"
        "    os._exit(0)",
        failed("REWARD_HACK"),
    ),
}
GPU_CHEATS = {
    "cheat_set_stream": (
        "_side = []\n",
        "if not _side:\n        _side.append(torch.cuda.Stream())\n"
        "    torch.cuda.set_stream(_side[0])\n    return {core}",
        failed("REWARD_HACK"),
    ),
}
# the thread cheat writes its destination late: destination-passing style
THREAD_CHEAT = (
    "import threading\n",
    "def _late():\n"
    "        time.sleep(0.03)\n"
    "        {output}.copy_({core})\n\n"
    "    threading.Thread(target=_late, daemon=True).start()",
    failed("REWARD_HACK"),
)

PY_HEADER = '"""{what} (corpus variant {tag})."""\n\nimport os\nimport sys\nimport time\n\nimport torch\n\n'


def python_solution(p: Problem, kind: str, language: str, tag: str) -> Made:
    core_src = p.triton_core if language == "triton" else p.torch_core
    core_src = textwrap.dedent(core_src).strip("\n").replace("{block}", str(_block(tag, (256, 512, 1024))))
    core_src = core_src.replace("{warps}", str(_block(tag, (4, 8))))
    # a matmul's tile of C per program: a vector kernel's block (256 to 1024) squared is an fp32
    # accumulator Triton takes minutes to compile (a correct solution timed out in the corpus)
    core_src = core_src.replace("{tile}", str(_block(tag, (32, 64))))
    core = f"_core({p.args})"
    fmt = {"core": core, "args": p.args, "first": p.inputs[0], "out_dtype": p.out_dtype, "output": p.output}
    dps = kind == "cheat_thread"
    if kind in PY_BODIES:
        prelude, (body, expect) = "", PY_BODIES[kind]
    elif kind == "compile_error":
        prelude, body, expect = "", "return {core} +  # not Python", COMPILE_ERROR
    else:
        prelude, body, expect = {**CHEATS, **GPU_CHEATS, "cheat_thread": THREAD_CHEAT}[kind]
    params = p.args + (f", {p.output}" if dps else "")
    text = (
        PY_HEADER.format(what=f"{p.short}: {kind} in {language}", tag=tag)
        + prelude.format(**fmt)
        + ("\n\n" if prelude else "")
        + core_src
        + f"\n\n\ndef run({params}):\n    "
        + body.format(**fmt)
        + "\n"
    )
    gpu_only = (
        language == "triton" or kind in GPU_CHEATS or kind in ("cheat_tf32", "cheat_patch_elapsed_time")
    )
    return Made(kind, language, {"kernel.py": text}, expect, dps=dps, gpu_only=gpu_only)


def shipped_solution(p: Problem, tag: str) -> Made | None:
    """The shipped pytorch solution, its text tagged."""
    sol_dir = SOLUTIONS / p.short / "pytorch"
    if not (sol_dir / "solution.json").is_file():
        return None
    spec = json.loads((sol_dir / "solution.json").read_text(encoding="utf-8"))
    sources = {
        s["path"]: f"# corpus variant {tag}\n" + (sol_dir / s["path"]).read_text(encoding="utf-8")
        for s in spec["sources"]
    }
    return Made("correct_shipped", "pytorch", sources, PASSED, dps=spec["spec"]["destination_passing_style"])


# host-side code of each C++ kind, around `compute(...)` (into `out`, then changed)
CPP_BODIES = {
    "correct": ("compute({call});", PASSED),
    "slow": (
        "for (int rep = 0; rep < 16; ++rep) compute({call});  // the same work sixteen times",
        {**PASSED, "slower": True},
    ),  # fmt: skip
    "off_by_one": (
        "compute({call});\n  {output}.copy_(at::roll({output}, {{1}}, {{-1}}));  // every element one place late",
        failed("INCORRECT_NUMERICAL"),
    ),  # fmt: skip
    "nan": ("compute({call});\n  {output}.fill_(NAN);", failed("INCORRECT_NUMERICAL")),
    "crash_raise": ('TORCH_CHECK(false, "the kernel gave up");', failed("RUNTIME_ERROR")),
    "hang": (
        "while (true) std::this_thread::sleep_for(std::chrono::milliseconds(50));",
        failed("TIMEOUT"),
    ),  # fmt: skip
    "compile_error": ("compute({call}) this is not C++;", COMPILE_ERROR),
}

CPP_HEADER = """// {what} (corpus variant {tag})
#include <torch/extension.h>

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <thread>

"""


def cuda_solution(p: Problem, kind: str, tag: str) -> Made:
    body, expect = CPP_BODIES[kind]
    tensors = ", ".join(f"torch::Tensor {n}" for n in (*p.inputs, p.output))
    call = ", ".join((*p.inputs, p.output))
    core = p.cuda_core.replace("{block}", str(_block(tag, (128, 256, 512)))).replace(
        "{tile}", str(_block(tag, (16, 32)))
    )
    text = (
        CPP_HEADER.format(what=f"{p.short}: {kind} in CUDA C++", tag=tag)
        + core.strip("\n")
        + f"\n\nvoid run({tensors}) {{\n  const c10::cuda::CUDAGuard guard({p.inputs[0]}.device());\n  "
        + body.format(call=call, output=p.output)
        + '\n}\n\nPYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("run", &run); }\n'
    )
    options = {"cflags": ["-O3"], "cuda_cflags": ["-O3"], "ld_flags": []}
    return Made(
        kind, "cuda_cpp", {"kernel.cu": text}, expect, dps=True, gpu_only=True, compile_options=options
    )


def _block(tag: str, choices: tuple[int, ...]) -> int:
    """A launch parameter chosen by the variant: varied source text, the same verdict."""
    return choices[int(tag, 16) % len(choices)]


# ------------------------------------------------------------------------------------ the corpus

PY_KINDS = (*PY_BODIES, "compile_error", *CHEATS, "cheat_thread")
TRITON_KINDS = ("correct", "slow", "off_by_one", "wrong_dtype", "nan", "crash_raise", "cheat_skip_when_timed",
                "cheat_id_cache")  # fmt: skip
CPP_KINDS = tuple(CPP_BODIES)
# what a CPU corpus holds, in this order: 20 solutions over its two problems, each kind at least once; the
# first 8 (the test's corpus) are the verdicts that stress a batch most: a hang, a process that ends, a
# forged channel, a compile error, a wrong answer, a cheat caught while timed, and honest ones
CPU_PLAN = (
    ("custom_inputs_matmul", "correct"), ("flux_rope", "crash_os_exit"),
    ("custom_inputs_matmul", "hang"), ("flux_rope", "cheat_forge_channel"),
    ("custom_inputs_matmul", "compile_error"), ("flux_rope", "off_by_one"),
    ("custom_inputs_matmul", "cheat_skip_when_timed"), ("flux_rope", "correct_shipped"),
    ("custom_inputs_matmul", "correct_shipped"), ("flux_rope", "slow"),
    ("custom_inputs_matmul", "cheat_gc_reference"), ("flux_rope", "wrong_dtype"),
    ("custom_inputs_matmul", "wrong_shape"), ("flux_rope", "nan"),
    ("flux_rope", "crash_raise"), ("custom_inputs_matmul", "crash_exit"),
    ("flux_rope", "cheat_patch_allclose"), ("custom_inputs_matmul", "cheat_subclass_output"),
    ("flux_rope", "cheat_id_cache"), ("flux_rope", "cheat_thread"),
    ("custom_inputs_matmul", "off_by_one"), ("flux_rope", "correct"), ("custom_inputs_matmul", "slow"),
    ("custom_inputs_matmul", "cheat_version_cache"),
)  # fmt: skip


def _cpu_plan(problems: dict[str, Problem]):
    for short, kind in itertools.cycle(CPU_PLAN):
        yield problems[short], "pytorch", kind


def _cuda_plan(problems: dict[str, Problem]):
    """Every problem with every kind of every language, over and over: a third C++, a third Triton (with
    the shipped-solution copies and the cheats on the PyTorch side)."""
    rounds = []
    for p in problems.values():
        rounds += [(p, "cuda_cpp", k) for k in CPP_KINDS]
        rounds += [(p, "triton", k) for k in TRITON_KINDS]
        rounds += [(p, "pytorch", k) for k in (*PY_KINDS, *GPU_CHEATS, "correct_shipped")]
    by_language = {lang: [r for r in rounds if r[1] == lang] for lang in ("cuda_cpp", "triton", "pytorch")}
    # interleave the languages so that any prefix is about a third each
    cycles = [itertools.cycle(v) for v in by_language.values()]
    yield from (r for trio in zip(*cycles, strict=False) for r in trio)


def make(problem: Problem, language: str, kind: str, tag: str) -> Made | None:
    if kind == "correct_shipped":
        return shipped_solution(problem, tag)
    if language == "cuda_cpp":
        return cuda_solution(problem, kind, tag)
    return python_solution(problem, kind, language, tag)


def solution_json(p: Problem, name: str, made: Made) -> dict:
    spec = {
        "languages": [made.language],
        "target_hardware": ["LOCAL"],
        "entry_point": f"{next(iter(made.sources))}::run",
        "dependencies": ["torch"] + (["triton >= 3.0"] if made.language == "triton" else []),
        "destination_passing_style": made.dps,
    }
    if made.language == "cuda_cpp":
        spec |= {"dependencies": [], "binding": "torch", "compile_options": made.compile_options}
    return {
        "name": name,
        "definition": p.definition,
        "author": "mini-kv corpus",
        "description": f"{made.kind} ({made.language}); expected verdict {made.expect}",
        "spec": spec,
        "sources": [{"path": path} for path in made.sources],
    }


def write_corpus(out: Path, count: int, device: str) -> list[dict]:
    problems = load_problems()
    plan = _cpu_plan(problems) if device == "cpu" else _cuda_plan(problems)
    entries = []
    for i, (p, language, kind) in enumerate(plan):
        if len(entries) == count:
            break
        tag = f"{i:04x}"
        made = make(p, language, kind, tag)
        if made is None or (device == "cpu" and made.gpu_only):
            continue
        name = f"{p.short}-{kind}-{language}-{tag}"
        sol_dir = out / p.short / name
        sol_dir.mkdir(parents=True)
        for path, text in made.sources.items():
            (sol_dir / path).write_text(text, encoding="utf-8")
        (sol_dir / "solution.json").write_text(json.dumps(solution_json(p, name, made), indent=1) + "\n")
        entries.append(
            {
                "solution": (sol_dir / "solution.json").relative_to(out).as_posix(),
                "problem": os.path.relpath(PROBLEMS / p.short, out),
                "name": name,
                "definition": p.definition,
                "language": language,
                "kind": kind,
                "expect": made.expect,
            }
        )
    return entries


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the corpus directory (created; must not exist or be empty)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    ap.add_argument("--count", type=int, help="how many solutions (default: 20 for cpu, 240 for cuda)")
    args = ap.parse_args(argv)
    count = args.count or DEFAULT_COUNT[args.device]
    if count < 1:
        ap.error(f"--count {count}: expected a positive number of solutions")
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        ap.error(f"--out {out}: exists and is not empty; give a new directory")
    out.mkdir(parents=True, exist_ok=True)
    try:
        entries = write_corpus(out, count, args.device)
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise
    corpus = {
        "schema_version": 1,
        "device": args.device,
        "options": OPTIONS[args.device],
        "solutions": entries,
    }
    (out / "corpus.json").write_text(json.dumps(corpus, indent=1) + "\n", encoding="utf-8")
    langs = {lang: sum(e["language"] == lang for e in entries) for lang in ("pytorch", "triton", "cuda_cpp")}
    print(
        f"{out}: {len(entries)} solutions for {args.device} ({', '.join(f'{n} {k}' for k, n in langs.items())})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
