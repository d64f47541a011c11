"""Packaging hook (everything else is in pyproject.toml): the JSON Schemas in the repository's
`schemas/`, their one copy, go into the built package as `mini_kv/schemas/`, so an installed
mini_kv (a wheel, `pip install .`) validates its files without the checkout beside it."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

SCHEMAS = Path(__file__).resolve().parent / "schemas"


class BuildPyWithSchemas(build_py):
    def _schema_copies(self) -> list[tuple[Path, Path]]:
        target = Path(self.build_lib) / "mini_kv" / "schemas"
        return [(src, target / src.name) for src in sorted(SCHEMAS.glob("*.schema.json"))]

    def run(self) -> None:
        super().run()
        copies = self._schema_copies()
        if not copies:  # an sdist without them would build a package that fails its first validation
            raise SystemExit(f"no *.schema.json under {SCHEMAS}: the package would ship without its schemas")
        for src, dst in copies:
            self.mkpath(str(dst.parent))
            self.copy_file(str(src), str(dst))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), *(str(dst) for _, dst in self._schema_copies())]


setup(cmdclass={"build_py": BuildPyWithSchemas})
