"""Task-card loader: the real card loads, good variants load, and every malformed card is rejected.

Each card under tests/task_cards/bad/ opens with a comment header the tests read:

    # field: cases[2].id        the field path the ConfigError must name ("(none)": no field applies)
    # wrong: ...                what is wrong with the card, for the human reader
    # message: ...              optional, repeatable: more text the message must contain
    # known-bug: ...            optional: the loader gets this card wrong today (strict xfail)

Paths inside the cards are relative to the project root (this repository, found through
pyproject.toml), exactly as in tasks/vector_add.yaml.
"""

from __future__ import annotations

import functools
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mini_kv.errors import ConfigError, ExitCode
from mini_kv.load.task_card import load_task_card
from mini_kv.model import DEFAULT_BENCHMARK, DEFAULT_TIMEOUTS

pytestmark = pytest.mark.usefixtures("judges_kept")  # conftest: one judge for the module's runs

REPO = Path(__file__).resolve().parents[1]
CARDS = Path(__file__).resolve().parent / "task_cards"
BAD = sorted((CARDS / "bad").glob("*.yaml"))
GOOD = sorted((CARDS / "good").glob("*.yaml"))
REAL_CARD = REPO / "tasks" / "vector_add.yaml"
HEADER_KEYS = {"field", "wrong", "message", "known-bug"}


def card_header(path: Path) -> dict[str, list[str]]:
    """The leading `# key: value` comment lines of a card."""
    header: dict[str, list[str]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        key, sep, value = line[1:].strip().partition(":")
        if sep and key.strip() in HEADER_KEYS:
            header.setdefault(key.strip(), []).append(value.strip())
    return header


def _bad_params():
    for path in BAD:
        header = card_header(path)
        marks = []
        if "known-bug" in header:
            marks.append(pytest.mark.xfail(strict=True, reason="loader bug: " + header["known-bug"][0]))
        yield pytest.param(path, header, id=path.stem, marks=marks)


# ---------------------------------------------------------------------------------------------
# the bad cards


def test_bad_card_collection_is_complete():
    assert len(BAD) >= 24
    for path in BAD:
        header = card_header(path)
        first = path.read_text(encoding="utf-8").splitlines()[0]
        assert first.startswith("# field: "), f"{path.name}: the first line must be `# field: <path>`"
        assert len(header.get("field", [])) == 1 and header["field"][0], path.name
        assert header.get("wrong"), f"{path.name}: needs a `# wrong:` line saying what is wrong"


@pytest.mark.parametrize(("path", "header"), list(_bad_params()))
def test_bad_card_is_rejected_naming_file_and_field(path: Path, header: dict[str, list[str]]):
    with pytest.raises(ConfigError) as info:
        load_task_card(path)
    err = info.value
    message = str(err)
    field = header["field"][0]

    assert str(path) in message, f"the message does not name the file: {message}"
    assert err.file == str(path)
    if field == "(none)":
        assert err.field == "", f"expected no field path, got {err.field!r}: {message}"
    else:
        assert field in message, f"the message does not name the field {field!r}: {message}"
    for text in header.get("message", []):
        assert text in message, f"the message lacks {text!r}: {message}"
    assert err.exit_code == ExitCode.CONFIG == 2


def test_base_template_of_bad_cards_is_valid():
    """Every bad card is good/base.yaml plus one defect, so the error can only come from that defect."""
    card = load_task_card(CARDS / "good" / "base.yaml")
    assert [c.id for c in card.cases] == [
        "n31-float32",
        "n31-float16",
        "n32-float32",
        "n32-float16",
        "n33-float32",
    ]


# ---------------------------------------------------------------------------------------------
# paths escaping through symlinks (built in a tmp project: git-tracked symlinks are fragile)

VECTOR_ADD_SOURCES = ("op.cpp", "kernel.cu", "op_cuda.cpp", "dtype_codes.h")


@pytest.fixture
def tmp_project(tmp_path: Path) -> Path:
    """A project with its own marker, a copy of the v0_naive candidate and a place outside it."""
    proj = tmp_path / "proj"
    cand = proj / "candidates" / "vector_add" / "v0_naive"
    cand.mkdir(parents=True)
    (proj / ".mini-kv-project").write_text("")
    (proj / "tasks").mkdir()
    for name in VECTOR_ADD_SOURCES:
        shutil.copy(REPO / "candidates" / "vector_add" / "v0_naive" / name, cand / name)
    outside = tmp_path / "outside"
    (outside / "v0_evil").mkdir(parents=True)
    for name in VECTOR_ADD_SOURCES:
        (outside / "v0_evil" / name).write_text("// not part of the project\n")
    (outside / "op_cuda.cpp").write_text("// not part of the project\n")
    (outside / "baselines").mkdir()
    (outside / "baselines" / "vector_add.json").write_text("{}\n")
    return proj


def _write_tmp_card(proj: Path, replacements: dict[str, str]) -> Path:
    text = (CARDS / "good" / "base.yaml").read_text(encoding="utf-8")
    for old, new in replacements.items():
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    card = proj / "tasks" / "card.yaml"
    card.write_text(text, encoding="utf-8")
    return card


V0_PATH = "path: candidates/vector_add/v0_naive"


def _link_candidate_dir(proj: Path) -> dict[str, str]:
    (proj / "candidates" / "vector_add" / "v0_link").symlink_to(proj.parent / "outside" / "v0_evil")
    return {V0_PATH: "path: candidates/vector_add/v0_link"}


def _link_source_file(proj: Path) -> dict[str, str]:
    src = proj / "candidates" / "vector_add" / "v0_naive" / "op_cuda.cpp"
    src.unlink()
    src.symlink_to(proj.parent / "outside" / "op_cuda.cpp")
    return {}


def _link_baseline_dir(proj: Path) -> dict[str, str]:
    (proj / "baselines").symlink_to(proj.parent / "outside" / "baselines")
    return {"benchmark:": "baseline: baselines/vector_add.json\nbenchmark:"}


def _link_parent_dir(proj: Path) -> dict[str, str]:
    """A symlinked directory part-way up the candidate path, relative link text."""
    (proj / "cands").symlink_to(Path("..") / "outside", target_is_directory=True)
    return {V0_PATH: "path: cands/v0_evil"}


@pytest.mark.parametrize(
    ("make_link", "field"),
    [
        pytest.param(_link_candidate_dir, "candidates[0].path", id="candidate-dir"),
        pytest.param(_link_source_file, "candidates[0].sources.cuda[1]", id="source-file"),
        pytest.param(_link_baseline_dir, "baseline", id="baseline-dir"),
        pytest.param(_link_parent_dir, "candidates[0].path", id="parent-dir-relative-link"),
    ],
)
def test_path_escaping_through_symlink_is_rejected(tmp_project: Path, make_link, field: str):
    card = _write_tmp_card(tmp_project, make_link(tmp_project))
    with pytest.raises(ConfigError) as info:
        load_task_card(card)
    message = str(info.value)
    assert str(card) in message
    assert field in message, message
    assert "outside the project" in message, message
    assert info.value.exit_code == 2


def test_symlink_staying_inside_the_project_is_accepted(tmp_project: Path):
    (tmp_project / "candidates" / "vector_add" / "v0_alias").symlink_to("v0_naive", target_is_directory=True)
    card = load_task_card(_write_tmp_card(tmp_project, {V0_PATH: "path: candidates/vector_add/v0_alias"}))
    assert card.project_root == str(tmp_project.resolve())
    assert card.candidates[0].path == "candidates/vector_add/v0_naive"


def test_card_outside_the_given_project_root_is_rejected(tmp_project: Path, tmp_path: Path):
    card = _write_tmp_card(tmp_project, {})
    stray = tmp_path / "outside" / "card.yaml"
    shutil.copy(card, stray)
    with pytest.raises(ConfigError) as info:
        load_task_card(stray, project_root=tmp_project)
    assert str(stray) in str(info.value)
    assert info.value.field == "(file)"
    assert info.value.exit_code == 2


def test_missing_card_file_is_a_config_error(tmp_path: Path):
    missing = tmp_path / "no_such_card.yaml"
    with pytest.raises(ConfigError) as info:
        load_task_card(missing)
    assert str(missing) in str(info.value)
    assert info.value.exit_code == 2


# ---------------------------------------------------------------------------------------------
# the real card and the good variants


def test_real_vector_add_card_loads():
    card = load_task_card(REAL_CARD)
    raw = yaml.safe_load(REAL_CARD.read_text(encoding="utf-8"))

    assert card.id == "vector_add" and card.version == "1.0.0"
    assert card.project_root == str(REPO)
    assert card.path == "tasks/vector_add.yaml"
    assert card.default_candidate == "v0_naive"
    assert [c.id for c in card.candidates][:2] == ["v0_naive", "v1_vectorized"]
    cand = card.candidate("v0_naive")
    assert cand.path == "candidates/vector_add/v0_naive"
    assert cand.namespace == "mini_kv_vector_add_v0_naive" and cand.op_name == "vector_add"
    assert cand.cpu_sources == ("op.cpp",) and cand.cuda_sources == ("kernel.cu", "op_cuda.cpp")
    assert cand.backward is True

    ids = [c.id for c in card.cases]
    assert len(ids) == len(set(ids)) == sum(len(entry["dtypes"]) for entry in raw["cases"])
    for expected in (
        "n31-float32",
        "n31-float16",
        "n1025-bfloat16",
        "n129_bf16-bfloat16",
        "shape_mismatch-float32",
        "bench_16m-float16",
    ):
        assert expected in ids
    assert "n31-bfloat16" not in ids
    by_id = {c.id: c for c in card.cases}
    assert by_id["n31-float32"].base_id == "n31" and by_id["n31-float32"].dtype == "float32"
    assert by_id["transposed-float32"].params == {"shape": [33, 65], "variant": "transposed"}
    assert by_id["device_mismatch-float32"].kind == "illegal"

    assert card.benchmark == {**DEFAULT_BENCHMARK, **raw["benchmark"]}
    assert card.timeouts == DEFAULT_TIMEOUTS
    assert card.baseline is None


@pytest.mark.parametrize("path", GOOD, ids=[p.stem for p in GOOD])
def test_good_card_loads(path: Path):
    card = load_task_card(path)
    assert card.project_root == str(REPO)
    assert card.path == str(path.relative_to(REPO))
    assert card.cases and card.candidates


def test_good_minimal_card_gets_defaults():
    card = load_task_card(CARDS / "good" / "minimal.yaml")
    assert card.default_candidate == "cpu_only"  # the first candidate
    assert card.candidates[0].cuda_sources == ()
    assert card.benchmark == DEFAULT_BENCHMARK
    assert card.timeouts == DEFAULT_TIMEOUTS
    assert card.baseline is None
    assert [c.id for c in card.cases] == ["n1-float64"]


def test_good_full_card_keeps_every_optional_field():
    card = load_task_card(CARDS / "good" / "full.yaml")
    assert card.default_candidate == "v0_naive_O3"
    assert [c.id for c in card.candidates] == ["v0_naive", "v0_naive_O3"]
    assert card.candidates[1].path == "candidates/vector_add/v0_naive"  # normalised
    assert card.candidates[1].op_name == "vector_add"  # overload stripped
    assert card.candidates[1].cuda_cflags == ("-O3", "--use_fast_math")
    assert card.benchmark["l2"] == "cold" and card.benchmark["cases"] == "all"
    assert card.timeouts == {"compile_s": 300, "case_s": 30.5, "stage_s": 900}
    assert card.baseline == "baselines/vector_add_full.json"
    # an illegal case may use a dtype without a tolerance
    assert "dtype_mismatch-float64" in [c.id for c in card.cases]
    assert "float64" not in card.tolerances


# ---------------------------------------------------------------------------------------------
# the command line: python -m mini_kv validate-task <card>

CLI_BAD = ["duplicate_case_id", "unknown_field_in_benchmark", "source_path_escapes_dotdot"]


def _run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mini_kv", *args], cwd=REPO, capture_output=True, text=True, timeout=300
    )


@functools.cache
def _validate_task_missing() -> str | None:
    """Why `python -m mini_kv validate-task` cannot be tested yet, or None when it exists."""
    if importlib.util.find_spec("mini_kv.cli") is None:
        return "src/mini_kv/cli.py does not exist yet, so `python -m mini_kv validate-task` cannot run"
    proc = _run_cli("validate-task", "--help")
    if proc.returncode != 0:
        return (
            f"`python -m mini_kv validate-task --help` exits {proc.returncode}: the validate-task "
            f"command does not exist yet ({(proc.stderr or proc.stdout).strip()[-200:]})"
        )
    return None


@pytest.fixture
def validate_task_cli():
    reason = _validate_task_missing()
    if reason:
        pytest.skip(reason)


@pytest.mark.usefixtures("validate_task_cli")
@pytest.mark.parametrize("name", CLI_BAD)
def test_cli_validate_task_rejects_bad_card(name: str):
    path = CARDS / "bad" / f"{name}.yaml"
    field = card_header(path)["field"][0]
    proc = _run_cli("validate-task", str(path.relative_to(REPO)))
    assert proc.returncode == ExitCode.CONFIG == 2, proc.stderr
    assert f"{name}.yaml" in proc.stderr, proc.stderr
    assert field in proc.stderr, proc.stderr


@pytest.mark.usefixtures("validate_task_cli")
def test_cli_validate_task_accepts_real_card():
    proc = _run_cli("validate-task", str(REAL_CARD.relative_to(REPO)))
    assert proc.returncode == 0, proc.stderr


def test_verify_refuses_a_reference_module_that_does_not_import_before_anything_is_built(
    tmp_project: Path, monkeypatch
):
    """verify loads a card without running its modules and imports them beside its worker's start
    (pipeline.CardDoor.prepare): a reference module that raises when imported is still the card's error,
    named by its field, exit 2, before any build."""
    from conftest import run_cli

    from mini_kv import pipeline

    (tmp_project / "broken_ref.py").write_text(
        "def reference(x, y):\n    return x + y\n\nraise RuntimeError('the reference module is broken')\n"
    )
    card = _write_tmp_card(
        tmp_project,
        {"reference: mini_kv.references.vector_add:reference": "reference: broken_ref:reference"},
    )
    built = []
    monkeypatch.setattr(pipeline, "compile_candidate", lambda *a, **k: built.append(a))
    res = run_cli("verify", "--task", str(card), "--device", "cpu", "--skip-benchmark", cwd=tmp_project)
    assert res.returncode == ExitCode.CONFIG, res.stdout + res.stderr
    said = res.stdout + res.stderr
    assert "operator.reference" in said and "the reference module is broken" in said, said
    assert not built
    sys.modules.pop("broken_ref", None)
