"""`sweep list` of a large grid does per-cell work only: the trainer's schema is built once
per process, and paths are resolved per file, not per cell (issue 10's 3.3 s for 1,000 cells)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

# Runs `sweep list` in a fresh process (the schema cache is per process) and counts what
# the profile of issue 10 found called per cell.
COUNTING = textwrap.dedent('''
    import collections, json, pathlib, sys, typing
    counts = collections.Counter()
    get_type_hints, resolve = typing.get_type_hints, pathlib.Path.resolve
    def counted_hints(obj, *args, **kwargs):
        counts["get_type_hints:" + getattr(obj, "__name__", "?")] += 1
        return get_type_hints(obj, *args, **kwargs)
    def counted_resolve(self, *args, **kwargs):
        counts["resolve"] += 1
        return resolve(self, *args, **kwargs)
    typing.get_type_hints, pathlib.Path.resolve = counted_hints, counted_resolve
    import trainer.config
    trainer.config._schema.cache_clear()
    from sweepkit.cli import main
    code = main(["list"])
    print(json.dumps({"code": code, **counts}), file=sys.stderr)
''')


def list_counts(sweeper, lrs: int) -> dict:
    sweeper.grid("big", f'''
        import sweepkit as sk
        base = sk.base(lr=1e-6, seed=0)
        sweep = sk.product(lr=[round(1e-6 * (i + 2), 12) for i in range({lrs})], seed=list(range(10)),
                           id="lr{{lr}}_s{{seed}}")
    ''')
    proc = subprocess.run([sys.executable, "-c", COUNTING], cwd=sweeper.path, capture_output=True, text=True,
                          timeout=300)
    assert f"{lrs * 10 + 1} cells in 1 grid" in proc.stdout, proc.stderr
    counts = json.loads(proc.stderr.strip().splitlines()[-1])
    assert counts.pop("code") == 0
    return counts


def test_the_trainer_schema_is_built_once_per_process_and_resolving_does_not_grow_with_cells(sweeper):
    small, large = list_counts(sweeper, 2), list_counts(sweeper, 20)  # 21 and 201 cells
    # Every cell is validated against the schema (twice, through two hooks): built once.
    assert small["get_type_hints:TrainerConfig"] == large["get_type_hints:TrainerConfig"] == 1
    # Resolving paths is per file and per run dir, not per cell.
    assert large["resolve"] == small["resolve"], (small, large)


def test_the_shared_schema_cannot_be_changed_by_a_caller():
    from trainer.config import schema

    fields = schema()
    assert schema() is fields
    with pytest.raises(TypeError):
        fields["lr"]["default"] = 1.0
    with pytest.raises(TypeError):
        fields["new_key"] = {}
    assert fields["lr"]["default"] == 1e-6 and fields["lr"]["type"] is float
    copy = {key: dict(spec) for key, spec in fields.items()}  # what a caller that edits it takes
    copy["lr"]["default"] = 1.0
    assert schema()["lr"]["default"] == 1e-6


def test_display_path_resolves_its_root_once(tmp_path, monkeypatch):
    import pathlib

    from sweepkit.errors import display_path

    root = tmp_path / "project"
    (root / "grids").mkdir(parents=True)
    link = tmp_path / "link"
    link.symlink_to(root)
    calls = []
    resolve = pathlib.Path.resolve
    monkeypatch.setattr(pathlib.Path, "resolve", lambda self, *a, **k: calls.append(self) or resolve(self, *a, **k))
    shown = [display_path(root / "grids" / f"g{i}.py", link) for i in range(50)]
    assert shown == [f"grids/g{i}.py" for i in range(50)]  # the root through a symlink is still the root
    assert len([path for path in calls if path == link]) == 1
    assert display_path(tmp_path / "elsewhere.py", link) == str(tmp_path / "elsewhere.py")
