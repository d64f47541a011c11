"""`mini-kv new card`: a task card and a candidate to fill in, scaffolded from a reference function;
`mini-kv new sol`: a SOL-ExecBench problem (definition.json, workload.jsonl) from a task card.

The reference and the input factory are the user's (`module:function`, importable from the project);
each `--case` is called through the factory once and the reference on its inputs, so the card written
is one whose cases run. The candidate's op.cpp declares the dispatcher schema from the reference's
parameters, with CPU and Meta kernels that raise "not written yet": `verify` runs it end to end at
once (build, load, correctness: INCORRECT with that message) and passes once the kernels are written.
The card is read back through the strict loader before the command says it is done."""

from __future__ import annotations

import importlib
import inspect
import json
import re
import shutil
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import yaml

from mini_kv.codec import to_json
from mini_kv.errors import ConfigError, ExitCode, UserError

# starting tolerances per dtype (the user tightens them): what an fp32 accumulation of the dtype reaches
DEFAULT_TOLERANCES = {
    "float64": {"atol": 1.0e-10, "rtol": 1.0e-10},
    "float32": {"atol": 1.0e-5, "rtol": 1.0e-5},
    "float16": {"atol": 1.0e-3, "rtol": 1.0e-3},
    "bfloat16": {"atol": 1.0e-2, "rtol": 1.0e-2},
}
_ID = re.compile(r"^[a-z][a-z0-9_]{0,63}$")

OP_CPP = """// {op} {version}: scaffolded by `mini-kv new card`. Write the CPU kernel (and the Meta kernel:
// the output's shape and dtype, no data), then `mini-kv verify --task {card}`.
#include <ATen/ATen.h>
#include <torch/library.h>

#define NS {namespace}

namespace {{

at::Tensor {op}_cpu({params}) {{
  TORCH_CHECK(false, "{op} {version}: the CPU kernel is not written yet ({where})");
}}

at::Tensor {op}_meta({params}) {{
  TORCH_CHECK(false, "{op} {version}: the Meta kernel is not written yet ({where})");
}}

}}  // namespace

TORCH_LIBRARY(NS, m) {{ m.def("{schema}"); }}
TORCH_LIBRARY_IMPL(NS, CPU, m) {{ m.impl("{op}", &{op}_cpu); }}
TORCH_LIBRARY_IMPL(NS, Meta, m) {{ m.impl("{op}", &{op}_meta); }}
"""


@dataclass(frozen=True)
class CaseSpec:
    """A `--case`: the card case's id and params (a case of kind core)."""

    id: str
    params: dict


def _case(spec: str) -> CaseSpec:
    """`ID:key=value,key=value` (values read as YAML: 31, [33, 65], zeros) -> a card case of kind core."""
    case_id, sep, rest = spec.partition(":")
    if not sep or not _ID.match(case_id):
        raise ConfigError("--case", spec, "ID:key=value[,key=value...], the id in lower case (n1024:n=1024)")
    params = {}
    for item in filter(None, re.split(r",(?![^\[]*\])", rest)):  # a comma inside [...] is the value's
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ConfigError("--case", spec, f"key=value pairs, got {item!r}")
        try:
            params[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError:
            raise ConfigError("--case", spec, f"a YAML value for {key.strip()!r}, got {value!r}") from None
    return CaseSpec(case_id, params)


def _param_names(reference, count: int) -> list[str]:
    """The reference's first `count` positional parameter names (a0, a1, ... where it takes *args)."""
    names = [
        p.name
        for p in inspect.signature(reference).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ][:count]
    return names if len(names) == count else [f"a{i}" for i in range(count)]


def _import_from(project: Path, *specs: str) -> list:
    """`module:function`s imported from the project, as the loader imports a card's."""
    from mini_kv.worker.inputs import import_path

    sys.path.insert(0, str(project))
    try:
        return [import_path(spec) for spec in specs]
    except (ImportError, AttributeError, ValueError) as exc:
        raise UserError(f"{', '.join(specs)}: {type(exc).__name__}: {exc}") from None
    finally:
        sys.path.remove(str(project))


def _try_cases(reference, factory, cases: list[CaseSpec], dtypes: list[str]) -> list[str]:
    """Run every case through the factory and the reference on CPU; the tensor parameters' names."""
    from mini_kv.worker.inputs import make_case_inputs

    names: list[str] = []
    for case in cases:
        for dtype in dtypes:
            try:
                args = make_case_inputs(factory, case.params, dtype, "cpu", 0)
                out = reference(*args)
            except Exception as exc:  # noqa: BLE001 - the user's code: said with the case that broke it
                raise UserError(f"case {case.id} ({dtype}): {type(exc).__name__}: {exc}") from None
            import torch

            if not isinstance(out, torch.Tensor):
                raise UserError(
                    f"case {case.id} ({dtype}): the reference returned {type(out).__name__}; a task "
                    "card's reference returns one torch.Tensor"
                )
            if not all(isinstance(a, torch.Tensor) for a in args):
                raise UserError(
                    "the input factory returned non-tensor arguments; the scaffold declares a schema of "
                    "tensors only (edit the card's op and the schema by hand for scalars)"
                )
            names = _param_names(reference, len(args))
    return names


def scaffold_card(args) -> tuple[Path, Path]:
    """Write the card and the candidate; both paths. Nothing is written when a check fails."""
    from mini_kv.load.task_card import load_task_card

    if not _ID.match(args.id):
        raise ConfigError("ID", args.id, "lower case letters, digits and _, starting with a letter")
    project = Path(args.project).resolve()
    card_path = project / "tasks" / f"{args.id}.yaml"
    cand_dir = project / "candidates" / args.id / "v0"
    for path in (card_path, cand_dir):
        if path.exists() and not args.force:
            raise UserError(f"{path} exists (--force replaces it)")
    dtypes = args.dtype or ["float32"]
    unknown = [d for d in dtypes if d not in DEFAULT_TOLERANCES]
    if unknown:
        raise ConfigError("--dtype", ",".join(unknown), f"one of {sorted(DEFAULT_TOLERANCES)}")
    cases = [_case(c) for c in args.case]
    reference, factory = _import_from(project, args.reference, args.inputs)
    names = _try_cases(reference, factory, cases, dtypes)
    namespace = f"{args.id}_v0"
    card = {
        "schema_version": 1,
        "id": args.id,
        "version": "0.1.0",
        "description": f"{args.id}: scaffolded from {args.reference}",
        "operator": {"name": args.id, "version": "0.1.0", "reference": args.reference, "inputs": args.inputs},
        "candidates": [
            {
                "id": "v0",
                "path": str(cand_dir.relative_to(project)),
                "op": f"{namespace}::{args.id}",
                "sources": {"cpu": ["op.cpp"]},
            }
        ],
        "default_candidate": "v0",
        "tolerances": {d: DEFAULT_TOLERANCES[d] for d in dtypes},
        # no YAML aliases: a list of dtypes each
        "cases": [{"id": c.id, "kind": "core", "params": c.params, "dtypes": list(dtypes)} for c in cases],
    }
    source = OP_CPP.format(
        op=args.id,
        version="v0",
        card=card_path.relative_to(project),
        namespace=namespace,
        where=cand_dir.relative_to(project) / "op.cpp",
        params=", ".join(f"const at::Tensor& {n}" for n in names),
        schema=f"{args.id}(" + ", ".join(f"Tensor {n}" for n in names) + ") -> Tensor",
    )
    card_path.parent.mkdir(parents=True, exist_ok=True)
    cand_dir.mkdir(parents=True, exist_ok=True)
    card_path.write_text(yaml.safe_dump(card, sort_keys=False))
    (cand_dir / "op.cpp").write_text(source)
    try:
        load_task_card(card_path, project_root=project)  # the strict loader: what verify will read
    except Exception:
        card_path.unlink()
        (cand_dir / "op.cpp").unlink()
        raise
    return card_path, cand_dir


# ------------------------------------------------------------------------ a SOL problem from a card

REFERENCE_TAIL = """

# the SOL-ExecBench entry point: the card's reference, {reference}
def run({params}):
    return {function}({params})
"""


def _sol_cases(problem, dtype: str | None) -> tuple[str, list]:
    """The card's cases of one dtype (default: the first a case lists), illegal ones left out (a
    workload is a valid call)."""
    legal = [c for c in problem.cases if c.kind != "illegal"]
    dtype = dtype or next((c.dtype for c in legal), None)
    cases = [c for c in legal if c.dtype == dtype]
    if not cases:
        have = sorted({c.dtype for c in legal})
        raise ConfigError(
            problem.path, "cases", f"a case of dtype {dtype} that is not illegal (have: {have})"
        )
    return dtype, cases


def _axes(named: dict[str, list[tuple]]) -> tuple[dict, dict[str, list[str]]]:
    """SOL axes from the shapes the cases made: each (tensor, dim) whose size is the same in every case
    is a const axis, others a var axis; dims whose sizes agree in every case share one axis (a + b's two
    lengths: one axis). The axes, and each tensor's shape as axis names."""
    axes: dict[str, dict] = {}
    by_sizes: dict[tuple, str] = {}
    shapes: dict[str, list[str]] = {}
    for name, per_case in named.items():
        dims = []
        for j in range(len(per_case[0])):
            sizes = tuple(shape[j] for shape in per_case)
            axis = by_sizes.get(sizes)
            if axis is None:
                axis = by_sizes[sizes] = f"{name}_{j}"
                const = len(set(sizes)) == 1
                axes[axis] = {"type": "const", "value": sizes[0]} if const else {"type": "var"}
            dims.append(axis)
        shapes[name] = dims
    return axes, shapes


def _sol_value(name: str, value, file: str):
    """A factory's argument or a reference's output: a tensor, or a Python scalar (a SOL scalar input)."""
    import torch

    if isinstance(value, (torch.Tensor, bool, int, float)):
        return value
    raise ConfigError(file, name, f"a tensor or a Python number, got {type(value).__name__}")


def _rank(values: list) -> tuple:
    return tuple(v.dim() if hasattr(v, "dim") else None for v in values)


def _run_cases(problem, cases: list, project: Path) -> tuple[list[str], list, list[str]]:
    """The reference's parameter names; each case with its inputs (the card's factory, on CPU) and the
    reference's outputs on them, for the cases whose tensors have the most common ranks (one SOL
    definition names each dim once); the ids of the others."""
    from mini_kv.worker.inputs import make_case_inputs

    reference, factory = _import_from(project, problem.operator["reference"], problem.operator["inputs"])
    runs = []
    for i, case in enumerate(cases):
        args = make_case_inputs(factory, case.params, case.dtype, "cpu", i)
        if args is None:
            continue  # not applicable on this machine
        out = reference(*args)
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        runs.append((case, [_sol_value(case.id, a, problem.path) for a in [*args, *outs]], len(args)))
    if not runs:  # an empty problem is an error, never a scaffold
        raise UserError(
            f"{problem.path}: the input factory made no inputs on CPU for any case of {cases[0].dtype}"
        )
    ranks = Counter(_rank(v) for _, v, _ in runs).most_common(1)[0][0]
    kept = [(c, v[:n], v[n:]) for c, v, n in runs if _rank(v) == ranks]
    left = [c.id for c, v, _ in runs if _rank(v) != ranks]
    return _param_names(reference, len(kept[0][1])), kept, left


@dataclass(frozen=True)
class DefinitionFile:
    """definition.json as `new sol` writes it (schemas/sol_definition.schema.json), in its field order."""

    name: str
    op_type: None
    description: str
    axes: dict[str, dict]
    custom_inputs_entrypoint: None
    inputs: dict[str, dict]  # name -> {shape, dtype}
    outputs: dict[str, dict]
    reference: str


def _sol_definition(problem, dtype: str, names: list[str], runs: list, module_source: str) -> DefinitionFile:
    import torch

    _, first_in, first_out = runs[0]
    out_names = ["out"] if len(first_out) == 1 else [f"out{i}" for i in range(len(first_out))]
    shapes = {
        n: [tuple(r[1][i].shape) for r in runs]
        for i, n in enumerate(names)
        if isinstance(first_in[i], torch.Tensor)
    }
    shapes |= {n: [tuple(r[2][i].shape) for r in runs] for i, n in enumerate(out_names)}
    axes, dims = _axes(shapes)

    def spec(name, value):
        if not isinstance(value, torch.Tensor):
            return {"shape": None, "dtype": {bool: "bool", int: "int64", float: "float32"}[type(value)]}
        return {
            "shape": dims[name],
            "dtype": str(value.dtype).removeprefix("torch."),
        }

    module, _, function = problem.operator["reference"].partition(":")
    params = ", ".join(names)
    return DefinitionFile(
        problem.id,
        None,
        f"{problem.id} {problem.version} ({dtype}), from the task card {Path(problem.path).name}: "
        + (problem.raw.get("description") or ""),
        axes,
        None,
        {n: spec(n, v) for n, v in zip(names, first_in, strict=True)},
        {n: spec(n, v) for n, v in zip(out_names, first_out, strict=True)},
        # a card's function already called `run` is the entry point as it is (a `run` calling it would recurse)
        module_source
        + (
            ""
            if function == "run"
            else REFERENCE_TAIL.format(reference=f"{module}:{function}", params=params, function=function)
        ),
    )


def scaffold_sol(args) -> tuple[Path, list[str]]:
    """Write `<out>/definition.json`, `workload.jsonl` and the inputs' safetensors files from a task card:
    each case of one dtype is a workload whose inputs are the card's factory's values (its edge values
    kept), its tolerance the card's for that dtype; the reference is the card's module, its `run` calling
    the card's function. Read back by the SOL loaders and the reference run on every workload before
    the command says it is done; nothing is left when a check fails."""
    from mini_kv.load.task_card import load_task_card
    from mini_kv.solexec.definition import load_definition
    from mini_kv.solexec.workload import DEFAULT_TOLERANCE, load_workloads

    project = Path(args.project).resolve()
    problem = load_task_card(Path(args.task).resolve(), project_root=project)
    out = Path(args.out or project / "problems" / problem.id).resolve()
    if out.exists() and not args.force:
        raise UserError(f"{out} exists (--force replaces it)")
    dtype, cases = _sol_cases(problem, args.dtype)
    names, runs, left = _run_cases(problem, cases, project)
    module = importlib.import_module(problem.operator["reference"].partition(":")[0])
    definition = _sol_definition(problem, dtype, names, runs, inspect.getsource(module))
    tol = problem.tolerances.get(dtype, {})
    tolerance = {
        "max_atol": tol.get("atol", DEFAULT_TOLERANCE["max_atol"]),
        "max_rtol": tol.get("rtol", DEFAULT_TOLERANCE["max_rtol"]),
        "required_matched_ratio": 1.0,
    }
    shutil.rmtree(out, ignore_errors=True)
    (out / "inputs").mkdir(parents=True)
    lines, kept = [], []
    for case, inputs, outputs in runs:
        descs = _workload_inputs(
            out, case.id, dict(zip(names, inputs, strict=True)), args.max_file_mb * 2**20
        )
        if descs is None:
            left.append(case.id)
            continue
        tensors = [*zip(names, inputs, strict=True), *zip(definition.outputs, outputs, strict=True)]
        sizes = {}
        for n, v in tensors:
            dims = (definition.inputs | definition.outputs)[n]["shape"] or []
            sizes |= {
                a: int(d) for a, d in zip(dims, v.shape, strict=True) if definition.axes[a]["type"] == "var"
            }
        lines.append({"uuid": case.id, "axes": sizes, "inputs": descs, "tolerance": tolerance})
        kept.append((case, inputs, outputs))
    (out / "definition.json").write_text(json.dumps(to_json(definition), indent=2) + "\n")
    (out / "workload.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    try:
        _check_sol(
            load_definition(out / "definition.json"),
            load_workloads(out / "workload.jsonl", load_definition(out / "definition.json")),
            kept,
        )
    except Exception:
        shutil.rmtree(out, ignore_errors=True)
        raise
    return out, left


def _workload_inputs(out: Path, case_id: str, inputs: dict, max_bytes: int) -> dict | None:
    """A workload's input descriptors: the factory's tensors in inputs/<case>.safetensors (their values
    kept: zeros, tiny, large), or, where that file would pass `max_bytes` (a roofline-sized bench case),
    SOL's `random` for floating-point tensors; None where a larger one holds integers (indices, offsets:
    random ones would not be valid)."""
    import torch
    from safetensors.torch import save_file

    tensors = {n: v.contiguous() for n, v in inputs.items() if isinstance(v, torch.Tensor)}
    scalars = {n: {"type": "scalar", "value": v} for n, v in inputs.items() if n not in tensors}
    if sum(t.nbytes for t in tensors.values()) > max_bytes:
        if not all(t.is_floating_point() for t in tensors.values()):
            return None
        return {n: scalars.get(n, {"type": "random"}) for n in inputs}
    file = f"inputs/{case_id}.safetensors"
    save_file(tensors, str(out / file))
    return {n: scalars.get(n, {"type": "safetensors", "path": file, "tensor_key": n}) for n in inputs}


def _check_sol(definition, workloads, runs) -> None:
    """The written reference, on each workload's stored inputs, gives the card reference's outputs (a
    workload of random inputs is not compared: its values are drawn when it runs)."""
    import torch

    from mini_kv.load.safetensors_file import load_tensor

    namespace: dict = {}
    exec(compile(definition.reference, definition.path, "exec"), namespace)  # noqa: S102 - the user's own card
    for w, (_, _, expected) in zip(workloads, runs, strict=True):
        if any(d["type"] == "random" for d in w.inputs.values()):
            continue
        args = [
            load_tensor(Path(w.safetensors[t.name]), w.inputs[t.name]["tensor_key"])
            if t.name in w.safetensors
            else w.inputs[t.name]["value"]
            for t in definition.inputs
        ]
        try:
            got = namespace["run"](*args)
        except Exception as exc:  # noqa: BLE001 - the card's own code: said with the workload it failed on
            raise UserError(
                f"{definition.path}: the written reference failed on workload {w.uuid}: {type(exc).__name__}: {exc}"
            ) from None
        got = list(got) if isinstance(got, (tuple, list)) else [got]
        if not all(torch.equal(g, e) for g, e in zip(got, expected, strict=True)):
            raise UserError(
                f"{definition.path}: the written reference gives other outputs than the card's on workload {w.uuid}"
            )


def cmd_new_sol(args) -> int:
    out, left = scaffold_sol(args)
    if left:
        print(
            f"left out (tensors of other ranks than the other cases', or integer inputs over --max-file-mb): {', '.join(left)}"
        )
    print(f"wrote {out / 'definition.json'}, {out / 'workload.jsonl'} and {out / 'inputs'}")
    print(f"next: write a solution (solution.json), then `mini-kv bench {out} --solution SOLUTION.json`")
    return ExitCode.OK


def cmd_new_card(args) -> int:
    card, cand = scaffold_card(args)
    print(f"wrote {card} and {cand / 'op.cpp'}")
    print(f"next: write the kernels in {cand / 'op.cpp'}, then `mini-kv verify --task {card}`")
    return ExitCode.OK


def register(sub) -> None:
    new = sub.add_parser(
        "new", help="scaffold a task card from a reference function, or a SOL problem from a card"
    )
    kinds = new.add_subparsers(dest="kind", required=True)
    card = kinds.add_parser("card", help="a task card and a candidate (op.cpp) to fill in")
    card.add_argument("id", metavar="ID", help="the task's and the op's name (lower case, digits, _)")
    card.add_argument("--reference", required=True, metavar="MOD:FN", help="the PyTorch reference")
    card.add_argument(
        "--inputs",
        required=True,
        metavar="MOD:FN",
        help="the input factory (params, dtype, device, generator)",
    )
    card.add_argument(
        "--case",
        action="append",
        required=True,
        metavar="ID:K=V[,K=V]",
        help="a core case and the factory's params (repeatable): n1024:n=1024",
    )
    card.add_argument("--dtype", action="append", metavar="DTYPE", help="repeatable; default float32")
    card.add_argument("--project", default=".", help="the project to write into (default: here)")
    card.add_argument("--force", action="store_true", help="replace a card or candidate that exists")
    card.set_defaults(func=cmd_new_card)
    sol = kinds.add_parser("sol", help="a SOL-ExecBench problem (definition, workloads) from a task card")
    sol.add_argument("task", metavar="CARD", help="the task card (tasks/ID.yaml)")
    sol.add_argument("--dtype", help="the cases of this dtype (default: the first a case lists)")
    sol.add_argument("--out", metavar="DIR", help="the problem directory to write (default: problems/ID)")
    sol.add_argument(
        "--max-file-mb",
        type=float,
        default=64,
        metavar="MB",
        help="a case's inputs stored up to this size; larger floating-point ones are drawn at random (default 64)",
    )
    sol.add_argument("--project", default=".", help="the card's project (default: here)")
    sol.add_argument("--force", action="store_true", help="replace a problem directory that exists")
    sol.set_defaults(func=cmd_new_sol)
