"""The documentation site builds with warnings as errors, and docstring examples all run."""

import pathlib
import subprocess
import sys

import fcall

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_site_builds_strict(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    for page in ("index", "how-it-works", "api", "faq", "migrating", "behaviour", "torchrl"):
        assert (tmp_path / page / "index.html").exists() or (tmp_path / f"{page}.html").exists()
    api = (tmp_path / "api" / "index.html").read_text()
    for name in fcall.__all__:
        if name != "__version__":
            assert f"fcall.{name}" in api, f"{name} missing from the API reference"


# Scripts whose page is not docs/guides/<name>.md.
PAGES = {
    "torchrl_dqn_target.py": "torchrl.md",
    "dcp_checkpoint_sweep.py": "guides/dcp-checkpoints.md",
}


def test_guide_pages_include_their_scripts():
    for script in (ROOT / "examples").glob("*.py"):
        if script.name.startswith("distributed_"):
            continue
        guide = "guides/" + script.name.replace(".py", ".md").replace("_", "-")
        page = ROOT / "docs" / PAGES.get(script.name, guide)
        assert page.exists(), f"no guide page for {script.name}"
        assert f'--8<-- "examples/{script.name}"' in page.read_text()


def test_docstring_examples_are_never_skipped():
    # pytest runs every docstring example of fcall/ (--doctest-modules, testpaths);
    # none may opt out.
    for path in (ROOT / "fcall").glob("*.py"):
        assert "+SKIP" not in path.read_text(), f"{path.name} skips a doctest"


def test_public_api_has_examples():
    for name in fcall.__all__:
        if name == "__version__":
            continue
        doc = getattr(fcall, name).__doc__ or ""
        assert ">>>" in doc, f"fcall.{name} has no runnable example in its docstring"


def test_readme_keeps_its_two_commands_first_and_links_the_site():
    text = (ROOT / "README.md").read_text()
    blocks = [b for b in text.split("```") if b.startswith("bash")]
    assert "-m fcall demo" in blocks[0] and "-m pytest" in blocks[1]
    assert text.index("-m pytest") < text.index("```python")
    for page in ("docs/index.md", "docs/guides/target-network.md", "docs/migrating.md"):
        assert page in text


def test_every_docs_page_is_in_the_nav():
    config = (ROOT / "mkdocs.yml").read_text()
    for path in (ROOT / "docs").rglob("*.md"):
        page = path.relative_to(ROOT / "docs").as_posix()
        assert page in config, f"docs/{page} is not in the mkdocs.yml nav"
