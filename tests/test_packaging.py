"""Dependencies say what uses them, and the `sweep` driver runs without the trainer's."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
IMPORT_NAMES = {"pyyaml": "yaml"}  # distribution name -> module name, where they differ


def _requirements(entries: list[str]) -> list[str]:
    return [re.split(r"[<>=!~\[; ]", entry, maxsplit=1)[0].lower() for entry in entries]


def _imported(module: str, roots: list[str]) -> bool:
    pattern = re.compile(rf"^\s*(import|from)\s+{re.escape(module)}\b", re.MULTILINE)
    return any(pattern.search(path.read_text()) for root in roots for path in (REPO / root).rglob("*.py"))


def _project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def test_every_core_dependency_is_imported_by_the_driver():
    for name in _requirements(_project()["dependencies"]):
        module = IMPORT_NAMES.get(name, name.replace("-", "_"))
        assert _imported(module, ["sweepkit", "plugins"]), f"{name} is a core dependency nobody imports"


def test_the_trainer_extra_is_what_the_trainer_imports_and_the_driver_does_not():
    extras = _project()["optional-dependencies"]
    for name in _requirements(extras["trainer"]):
        module = IMPORT_NAMES.get(name, name.replace("-", "_"))
        assert _imported(module, ["trainer"]), f"{name} is in the trainer extra but trainer/ never imports it"
        assert not _imported(module, ["sweepkit"]), f"sweepkit imports {name}, which a login node may not have"
    assert _requirements(extras["ray"]) == ["ray"]


def test_sweep_list_and_a_dry_run_do_not_import_torch(tmp_path):
    program = (
        "import sys\n"
        "from sweepkit.cli import main\n"
        f"assert main(['--rootdir', {str(REPO)!r}, '--runs-dir', {str(tmp_path)!r}, 'list', 'grids/']) == 0\n"
        f"assert main(['--rootdir', {str(REPO)!r}, '--runs-dir', {str(tmp_path)!r}, 'run', "
        "'grids/learn_synthetic.py', '--dry-run']) == 0\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'safetensors', 'pyarrow', 'ray') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    result = subprocess.run([sys.executable, "-c", program], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
