"""``python -m benchmarks matrix --quick`` runs and reports every cell of the matrix (no
timing is asserted: the machine's load decides the numbers). One subprocess for the module,
about a minute on two cores (tiny sizes, three rounds, aot_eager only), so it stays in the
normal suite: CI's smoke run of the benchmarks, run as a user would, outside pytest."""

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks import _harness, _report, matrix  # noqa: E402


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict]:
    out = tmp_path_factory.mktemp("matrix") / "quick.json"
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks", "matrix", "--quick", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    return result.stdout, json.loads(out.read_text())


def test_the_matrix_has_every_api_container_and_kind():
    assert len(matrix.CELLS) == len(matrix.APIS) * len(matrix.CONTAINERS) * len(matrix.KINDS)
    assert len(set(matrix.CELLS)) == len(matrix.CELLS) == 45


def test_quick_mode_prints_and_records_every_cell_beside_its_peer(quick_run):
    stdout, results = quick_run
    tables = [t for t in results if t.startswith(("eager", "compiled"))]
    assert tables == ["eager", "compiled aot_eager"]
    for table in tables:
        for leaves, row in results[table].items():
            for cell in matrix.CELLS:
                assert row[cell]["ratio"] > 0, (table, leaves, cell)
                assert row[cell]["us"] > 0
            peers = [name for name in row if name not in matrix.CELLS]
            assert peers, f"{table} @ {leaves}: no peer beside the cells"
    for cell in matrix.CELLS:
        assert stdout.count(f"  {cell} ") >= 3, cell  # eager at two sizes, compiled at one
    compiled = results["compiled aot_eager"]["4"]
    assert all(compiled[cell]["guard_us"] > 0 for cell in matrix.CELLS)  # no recompile
    assert all(compiled[cell]["guard_ratio"] > 0 for cell in matrix.CELLS)  # beside the peer
    for name, values in compiled.items():  # CPU seconds, and the wall time beside them
        assert values["compile_s"] > 0 and values["compile_wall_s"] > 0, name
    assert set(results["eager"]) == set(results["guards"]) == {"4", "16"}  # sizes apart
    assert results["extremes"]["compiled aot_eager @ 4"]["slowest"][0] in matrix.CELLS
    meta = results["meta"]
    assert meta["suite"] == "matrix" and meta["complete"] and meta["quick"]
    assert len(meta["parts"]) == 4  # eager and guards at two sizes, a process each


def test_the_markdown_tables_have_a_row_per_cell(quick_run):
    _, results = quick_run
    text = _report.markdown("matrix", results)
    assert text.startswith("Run of ") and "a `--quick` run" in text.splitlines()[0]
    for cell in matrix.CELLS:
        row = next(
            line
            for line in text.splitlines()
            if line.startswith(f"| {cell.replace(' | ', ' · ')} |")
        )
        assert row.count("|") == 6  # the cell; eager at two sizes, compiled, compile ratio
    assert "| guard check per call (to torch.func, to TensorDict) | 4 | 16 |" in text


def test_merge_writes_the_sections_of_several_runs_as_one(quick_run, tmp_path, capsys):
    _, results = quick_run
    eager = {"meta": results["meta"], "eager": results["eager"]}
    compiled = {k: v for k, v in results.items() if k != "eager"}
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for path, part in zip(paths, (eager, compiled)):
        path.write_text(json.dumps(part))
    out = tmp_path / "merged.json"
    command = [sys.executable, "-m", "benchmarks", "merge", *map(str, paths), "--out", str(out)]
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True)
    merged = json.loads(out.read_text())
    assert merged["eager"] == results["eager"]
    assert merged["compiled aot_eager"] == results["compiled aot_eager"]
    assert merged["extremes"] == results["extremes"] and len(merged["meta"]["parts"]) == 2
    assert merged["meta"]["commits"] == [results["meta"]["commit"]]
    other = {**compiled, "meta": {**results["meta"], "commit": "other"}}
    merged = _harness.merge([eager, other])
    assert merged["meta"]["commits"] == sorted([results["meta"]["commit"], "other"])
    assert capsys.readouterr().out.count("different commits") == 1
