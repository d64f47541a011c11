"""One settings object holds every default (mini_kv.settings); a run's timing settings are the defaults
overridden by the card, then the command line, then the environment, and benchmark.json records them."""

import ast
import dataclasses
from pathlib import Path

import pytest

from mini_kv.codec import to_json
from mini_kv.errors import UserError
from mini_kv.load.task_card import load_task_card
from mini_kv.model import DEFAULT_BENCHMARK, DEFAULT_TIMEOUTS
from mini_kv.pipeline import VerifyOptions, benchmark_settings
from mini_kv.settings import DEFAULTS, ENV_KEYS, resolve
from mini_kv.solexec.run import BenchOptions, check_options

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def no_env(monkeypatch):
    for var in ENV_KEYS:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


MINIMAL = ROOT / "tests" / "task_cards" / "good" / "minimal.yaml"  # no benchmark or timeouts section


def test_a_card_without_a_benchmark_section_gets_the_defaults(no_env):
    card = load_task_card(MINIMAL)
    assert card.benchmark == DEFAULT_BENCHMARK and card.benchmark["cases"] == DEFAULTS.cases == "bench"
    assert card.timeouts == DEFAULT_TIMEOUTS == {"compile_s": 600.0, "case_s": 120.0, "stage_s": 1800.0}
    assert benchmark_settings(card, VerifyOptions(), "cpu").max_cv == DEFAULTS.max_cv == 0.03


def test_card_then_command_line_then_environment(no_env):
    card = load_task_card(MINIMAL)
    card = dataclasses.replace(card, benchmark={**card.benchmark, "max_cv": 0.04, "max_p95_cv": 0.2})
    assert benchmark_settings(card, VerifyOptions(), "cpu").max_cv == 0.04
    assert benchmark_settings(card, VerifyOptions(max_cv=0.05), "cpu").max_cv == 0.05
    no_env.setenv("MINI_KV_MAX_CV", "0.07")
    got = benchmark_settings(card, VerifyOptions(max_cv=0.05), device="cpu", case_timeout=60.0)
    assert got.max_cv == 0.07 and got.max_p95_cv == 0.2
    no_env.setenv("MINI_KV_BUDGET", "1.5")
    assert (
        benchmark_settings(card, VerifyOptions(budget=2.0), device="cpu", case_timeout=60.0).budget_s == 1.5
    )


def test_the_recorded_settings_hold_only_what_the_front_door_has(no_env):
    """benchmark.json's `settings` (and a SOL suite hash): a card's keys, a SOL run's keys, and the two
    switches only when asked for, so attempts recorded before stay comparable."""
    card = to_json(benchmark_settings(load_task_card(MINIMAL), VerifyOptions(), "cpu", 60.0))
    common = {"method", "l2", "warmup", "repeats", "samples", "max_cv", "max_p95_cv", "target_rel_ci"}
    common |= {"min_samples", "max_samples", "budget_s"}
    assert set(card) == common | {"graph_launches", "cases"}
    sol = to_json(check_options(BenchOptions(solution="s.json", require_own_kernels=True), "cpu"))
    assert set(sol) == common | {"rounds", "require_own_kernels"} and sol["max_cv"] == DEFAULTS.max_cv
    extra = check_options(BenchOptions(solution="s.json", extra_workloads=3, extra_workloads_seed=7), "cpu")
    assert to_json(extra)["extra_workloads"] == {"count": 3, "seed": 7}


@pytest.mark.parametrize("raw", ["x", "0", "-1", "nan", "inf"])
def test_an_environment_value_that_is_not_a_positive_number_names_its_variable(raw):
    with pytest.raises(UserError, match="MINI_KV_MAX_CV"):
        resolve({}, "cpu", None, environ={"MINI_KV_MAX_CV": raw})
    assert resolve({}, "cpu", None, environ={"MINI_KV_SAMPLES": "7", "OTHER": "1"}).samples == 7


def test_the_front_doors_take_their_defaults_from_the_one_object():
    opts = BenchOptions(solution="solution.json")
    assert (opts.max_cv, opts.max_p95_cv, opts.timeout, opts.rounds) == (
        DEFAULTS.max_cv,
        DEFAULTS.max_p95_cv,
        DEFAULTS.sol_timeout_s,
        DEFAULTS.sol_rounds,
    )
    assert resolve({}, "cuda:0", None, environ={}).target_rel_ci == DEFAULTS.cuda.target_rel_ci


def _cv_literals(tree: ast.AST) -> list[int]:
    """Lines where a number is given to something named *cv*: a default argument, an assignment, a
    dict entry, `.get("max_cv", n)` or `add_argument("--max-cv", default=n)`."""
    pairs = []  # (name, value node)
    for node in ast.walk(tree):
        if isinstance(node, ast.arguments):
            args = [*node.posonlyargs, *node.args]
            pairs += zip([a.arg for a in args[len(args) - len(node.defaults) :]], node.defaults, strict=True)
            pairs += [(a.arg, d) for a, d in zip(node.kwonlyargs, node.kw_defaults, strict=True) if d]
        elif isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                pairs.append((ast.unparse(t), node.value))
        elif isinstance(node, ast.Dict):
            pairs += [(ast.unparse(k), v) for k, v in zip(node.keys, node.values, strict=True) if k]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            name = str(node.args[0].value)
            pairs += [(name, v) for v in node.args[1:2]] + [(name, k.value) for k in node.keywords]
    return [
        v.lineno
        for name, v in pairs
        if "cv" in name.lower() and isinstance(v, ast.Constant) and isinstance(v.value, int | float)
    ]


def test_the_stability_thresholds_are_written_once():
    """No number is given to a *cv* setting outside settings.py: the others refer to DEFAULTS."""
    hits = [
        f"{p.relative_to(ROOT)}:{line}"
        for p in sorted((ROOT / "src" / "mini_kv").rglob("*.py"))
        if p.name != "settings.py"
        for line in _cv_literals(ast.parse(p.read_text()))
    ]
    assert not hits, hits
    assert len(_cv_literals(ast.parse((ROOT / "src" / "mini_kv" / "settings.py").read_text()))) == 2
