"""The benchmarks' harness, runner and report: docs/performance.md's result tables are what
``python -m benchmarks report`` makes of the committed JSON, the interleaved rounds pair
each cell with its peer as they say, and every suite's ``--quick`` run works and records."""

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks import _harness, _report  # noqa: E402
from benchmarks.__main__ import SUITES  # noqa: E402


def test_the_page_holds_the_tables_the_committed_json_makes():
    page = _report.PAGE.read_text()
    assert _report.render(page) == page, "run `python -m benchmarks report`"
    committed = {path.stem for path in _harness.RESULTS.glob("*.json")}
    assert committed == set(_report.blocks(page)) == {"first_compile", "floor", "matrix", "swap"}


def test_the_page_opens_with_the_results_then_how_to_reproduce_then_method():
    page = _report.PAGE.read_text()
    headings = [line for line in page.splitlines() if line.startswith("## ")]
    assert headings[0] == "## Current results"
    assert headings.index("## Reproduce") < headings.index("## Method") == len(headings) - 1
    assert page.index("<!-- results: matrix -->") < page.index("## Reproduce")


def test_a_block_is_rewritten_from_its_json(tmp_path):
    results = {"meta": {"date": "2026-12-02T10:00:00", "commit": "abc1234", "torch": "2.13"}}
    results["a table"] = {"row": {"µs": 12.345, "ratio": 0.5, "graphs": "2/2"}}
    (tmp_path / "demo.json").write_text(json.dumps(results))
    page = "# P\n\n<!-- results: demo -->\nstale\n<!-- /results: demo -->\n\nafter\n"
    text = _report.render(page, tmp_path)
    assert "stale" not in text and text.endswith("<!-- /results: demo -->\n\nafter\n")
    assert "Run of 2026-12-02, commit `abc1234`, torch 2.13." in text
    assert "| a table | µs | ratio | graphs |" in text and "| row | 12.35 | 0.50 | 2/2 |" in text


def test_report_check_fails_on_a_stale_page(tmp_path, monkeypatch):
    page = tmp_path / "performance.md"
    text = _report.PAGE.read_text()
    row = "| swap · TensorDict · plain | "
    assert row in text  # the generated matrix table
    page.write_text(text.replace(row, row + "9.99 (edited) | ", 1))
    assert _report.report(check=True, page_path=page) == 1
    page.write_text(text)
    assert _report.report(check=True, page_path=page) == 0


def test_each_cell_runs_right_beside_its_peer_and_the_rest_in_turn():
    order: list[str] = []
    fns = {name: (lambda name=name: order.append(name)) for name in ("a", "b", "peer", "other")}
    peer_of = {"a": "peer", "b": "peer"}.get
    times, beside = _harness.rounds_of(fns, 2, 1, lambda n: peer_of(n) or n)
    assert order == ["peer", "a", "peer", "b", "other", "b", "peer", "a", "peer", "other"]
    assert set(beside) == {"a", "b"} and all(len(t) == 2 for t in beside.values())
    assert len(times["peer"]) == 4 and len(times["a"]) == len(times["other"]) == 2
    assert _harness.paired([2.0, 3.0, 4.0], [1.0, 1.0, 2.0]) == 2.0
    assert _harness.difference([2.0, 3.0, 5.0], [1.0, 1.0, 1.0]) == 2.0


def test_the_runner_lists_every_suite():
    listed = subprocess.run(
        [sys.executable, "-m", "benchmarks"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    for name in SUITES:
        assert f"  {name} " in listed
    files = {p.stem for p in (ROOT / "benchmarks").glob("*.py") if not p.stem.startswith("_")}
    assert files == set(SUITES), "a script beside the suites: fold it into one"


QUICK = [name for name in SUITES if name != "matrix"]  # the matrix: test_benchmark_matrix.py


@pytest.mark.parametrize("suite", QUICK)
def test_a_quick_run_of_each_suite_records_its_tables(suite, tmp_path):
    out = tmp_path / f"{suite}.json"
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks", suite, "--quick", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    results = json.loads(out.read_text())
    meta = results["meta"]
    assert meta["suite"] == suite and meta["quick"] and meta["complete"] and meta["commit"]
    tables = {name: rows for name, rows in results.items() if name != "meta"}
    if suite == "torchrl" and "skipped" in result.stdout:
        assert not tables  # not the TorchRL stack
        return
    assert tables and all(tables.values()), tables
    assert _report.markdown(suite, results).count("| --- |") == len(tables)
