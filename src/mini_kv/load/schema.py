"""JSON Schema validation (Draft 2020-12) with errors that name the file and field path."""

from __future__ import annotations

import functools
import json
import re
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from mini_kv.codec import from_json
from mini_kv.errors import ConfigError, UserError

if TYPE_CHECKING:  # imported on first use (_validator_class): a judge validates no file
    from jsonschema import ValidationError

R = TypeVar("R")

# A source checkout (editable install, PYTHONPATH=src) reads the repository's schemas/; a built
# package (wheel, `pip install .`) carries them as mini_kv/schemas/ (setup.py copies them in).
CHECKOUT_SCHEMA_DIR = Path(__file__).resolve().parents[3] / "schemas"


def schema_locations(name: str) -> list:
    """Where `name`'s schema may be, in the order looked: the package's copy, then the checkout's."""
    filename = f"{name}.schema.json"
    return [resources.files("mini_kv").joinpath("schemas").joinpath(filename), CHECKOUT_SCHEMA_DIR / filename]


def _is_integer(checker, instance) -> bool:
    # JSON Schema counts 3.0 as an integer; mini_kv uses these values as sizes and counts (range(20.0)
    # raises), so only a true integer is one here, and a boolean never is
    return isinstance(instance, int) and not isinstance(instance, bool)


@functools.cache
def _validator_class():
    """Draft 2020-12 with mini_kv's integers; jsonschema imported on the first check, not with this module
    (a judge imports the loaders' records but checks no file: 75 ms of its start)."""
    import jsonschema

    return jsonschema.validators.extend(
        jsonschema.Draft202012Validator,
        type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_integer),
    )


@functools.cache
def load_schema(name: str) -> dict:
    locations = schema_locations(name)
    found = next((p for p in locations if p.is_file()), None)
    if found is None:
        raise UserError(
            f"mini_kv's schema {name}.schema.json is missing: looked in "
            + " and ".join(str(p) for p in locations)
            + "; this mini_kv is installed without its data files (reinstall it from a wheel, "
            "or run it from a source checkout)"
        )
    # not checked against the metaschema here: schemas/ is, by scripts/check_files.py in CI (the wheel
    # ships those files), and checking the six a `bench` loads took ~70 ms of every command
    return json.loads(found.read_text(encoding="utf-8"))


def field_path(parts) -> str:
    """Render a jsonschema path deque as `cases[3].dtypes[0]`."""
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _describe(error: ValidationError) -> tuple[str, str]:
    path = field_path(error.absolute_path)
    if error.validator == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        extra = sorted(set(error.instance) - set(allowed)) if isinstance(error.instance, dict) else []
        for key in extra:
            if not any(re.fullmatch(p, key) for p in error.schema.get("patternProperties", {})):
                where = f"{path}.{key}" if path != "(top level)" else key
                allowed_text = ", ".join(allowed) or "names matching " + " or ".join(
                    error.schema.get("patternProperties", {})
                )
                return where, f"unknown field; allowed fields here are {allowed_text}"
    if error.validator == "required":
        missing = error.message.split("'")[1] if "'" in error.message else error.message
        where = f"{path}.{missing}" if path != "(top level)" else missing
        return where, "required field is missing"
    if error.validator == "const" and error.absolute_path and error.absolute_path[-1] == "schema_version":
        return path, (
            f"unsupported schema_version {error.instance!r}; this mini_kv reads version "
            f"{error.validator_value!r} (upgrade mini_kv or migrate the file)"
        )
    expected = error.schema.get("description") if error.validator in ("pattern", "format") else None
    return path, f"{error.message}" + (f" (expected {expected})" if expected else "")


def validate(instance: Any, schema_name: str, file: str) -> None:
    """Raise ConfigError for the first (most specific, deepest) violation."""
    validator = _validator_class()(load_schema(schema_name))
    errors = list(validator.iter_errors(instance))
    if not errors:
        return
    from jsonschema.exceptions import best_match

    best = best_match(errors)
    path, expected = _describe(best)
    raise ConfigError(file, path, expected)


def is_valid(instance: Any, schema_name: str) -> bool:
    return _validator_class()(load_schema(schema_name)).is_valid(instance)


def read_record(cls: type[R], data: Any, schema_name: str, file: str) -> R:
    """The record `cls` held in `data`, once `data` passes schemas/<schema_name>.schema.json, so a
    reader gets a typed record or a ConfigError naming the file and field, never a half-read dict."""
    validate(data, schema_name, file)
    return from_json(cls, data)
