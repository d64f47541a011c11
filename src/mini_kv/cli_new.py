"""`mini-kv new card`: a task card and a candidate to fill in, scaffolded from a reference function.

The reference and the input factory are the user's (`module:function`, importable from the project);
each `--case` is called through the factory once and the reference on its inputs, so the card written
is one whose cases run. The candidate's op.cpp declares the dispatcher schema from the reference's
parameters, with CPU and Meta kernels that raise "not written yet": `verify` runs it end to end at
once (build, load, correctness: INCORRECT with that message) and passes once the kernels are written.
The card is read back through the strict loader before the command says it is done."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import yaml

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


def _case(spec: str) -> dict:
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
    return {"id": case_id, "kind": "core", "params": params}


def _tensor_params(reference, sample: tuple) -> list[str]:
    """The reference's parameter names for the factory's tensors (a0, a1, ... where it takes *args)."""
    import torch

    if not all(isinstance(a, torch.Tensor) for a in sample):
        raise UserError(
            "the input factory returned non-tensor arguments; the scaffold declares a schema of tensors "
            "only (edit the card's op and the schema by hand for scalars)"
        )
    names = [
        p.name
        for p in inspect.signature(reference).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    return names[: len(sample)] if len(names) >= len(sample) else [f"a{i}" for i in range(len(sample))]


def _try_cases(reference, factory, cases: list[dict], dtypes: list[str]) -> list[str]:
    """Run every case through the factory and the reference on CPU; the tensor parameters' names."""
    from mini_kv.worker.inputs import make_case_inputs

    names: list[str] = []
    for case in cases:
        for dtype in dtypes:
            try:
                args = make_case_inputs(factory, case["params"], dtype, "cpu", 0)
                out = reference(*args)
            except Exception as exc:  # noqa: BLE001 - the user's code: said with the case that broke it
                raise UserError(f"case {case['id']} ({dtype}): {type(exc).__name__}: {exc}") from None
            import torch

            if not isinstance(out, torch.Tensor):
                raise UserError(
                    f"case {case['id']} ({dtype}): the reference returned {type(out).__name__}; a task "
                    "card's reference returns one torch.Tensor"
                )
            names = _tensor_params(reference, tuple(args))
    return names


def scaffold_card(args) -> tuple[Path, Path]:
    """Write the card and the candidate; both paths. Nothing is written when a check fails."""
    from mini_kv.load.task_card import load_task_card
    from mini_kv.worker.inputs import import_path

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
    import sys

    sys.path.insert(0, str(project))  # the project's modules, as the loader imports them
    try:
        reference, factory = import_path(args.reference), import_path(args.inputs)
    except (ImportError, AttributeError, ValueError) as exc:
        raise UserError(f"--reference/--inputs: {type(exc).__name__}: {exc}") from None
    finally:
        sys.path.remove(str(project))
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
        "cases": [{**c, "dtypes": list(dtypes)} for c in cases],  # no YAML aliases: a list each
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


def cmd_new_card(args) -> int:
    card, cand = scaffold_card(args)
    print(f"wrote {card} and {cand / 'op.cpp'}")
    print(f"next: write the kernels in {cand / 'op.cpp'}, then `mini-kv verify --task {card}`")
    return ExitCode.OK


def register(sub) -> None:
    new = sub.add_parser("new", help="scaffold a task card and a candidate from a reference function")
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
