"""Imports follow the layer table in docs/architecture.md, read from the document itself."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "specsure"
DOC = ROOT / "docs" / "architecture.md"
TORCH_FREE_BENCH = ("generation", "results", "report", "plots", "load")
"""specsure.bench modules that read and render results; the document's "Layers" section names them."""


def layer_table() -> dict[str, tuple[set[str], bool]]:
    """{layer: (layers it may import, torch banned)} from the "Layers" table."""
    section = DOC.read_text(encoding="utf-8").split("## Layers", 1)[1].split("\n## ", 1)[0]
    table: dict[str, tuple[set[str], bool]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not (m := re.fullmatch(r"`specsure\.(\w+)`", cells[0])):
            continue
        allowed = set(re.findall(r"`specsure\.(\w+)`", cells[2]))
        table[m.group(1)] = (allowed, "no torch" in cells[2])
    return table


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in a file: top level, function level and TYPE_CHECKING."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.extend((node.lineno, f"{node.module}.{alias.name}") for alias in node.names)
    return found


def layer_of(path: Path) -> str | None:
    parts = path.relative_to(PACKAGE).parts
    return parts[0].removesuffix(".py") if len(parts) > 1 or parts[0] not in ("__init__.py", "__main__.py") else None


def test_the_table_names_every_layer_in_the_package() -> None:
    table = layer_table()
    on_disk = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    on_disk |= {p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__")}
    assert set(table) == on_disk
    assert table["config"] == (set(), True)


def test_imports_never_go_up_the_layer_table() -> None:
    table = layer_table()
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        layer = layer_of(path)
        if layer is None:
            continue  # the package root re-exports the public API; its imports are checked below
        allowed, no_torch = table[layer]
        for line, module in imports(path):
            top = module.split(".")
            if top[0] == "torch" and no_torch:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {module} (layer {layer} has no torch)")
            if top[0] == "specsure" and len(top) > 1 and top[1] != layer and top[1] not in allowed:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {module} (layer {layer} may import "
                             f"{sorted(allowed) or 'no other layer'})")
    assert not wrong, "\n".join(wrong)


def test_the_package_imports_absolutely() -> None:
    """A relative import would escape the layer check above, which reads absolute module names."""
    relative = [f"{path.relative_to(ROOT)}:{node.lineno}" for path in sorted(PACKAGE.rglob("*.py"))
                for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                if isinstance(node, ast.ImportFrom) and node.level > 0]
    assert not relative, "\n".join(relative)


def test_torch_free_bench_modules_import_no_torch() -> None:
    wrong = [f"bench/{name}.py:{line} imports {module}"
             for name in TORCH_FREE_BENCH
             for line, module in imports(PACKAGE / "bench" / f"{name}.py")
             if module.split(".")[0] == "torch" or module.startswith("specsure.bench.runners")
             or module.startswith("specsure.bench.configs")]
    assert not wrong, "\n".join(wrong)
    assert all(f"`{name}`" in DOC.read_text(encoding="utf-8") for name in TORCH_FREE_BENCH)


@pytest.mark.parametrize("module", ["specsure", "specsure.config", "specsure.vllm_check", "specsure.vllm_plugin",
                                    *(f"specsure.bench.{name}" for name in TORCH_FREE_BENCH)])
def test_torch_free_modules_load_without_torch(module: str) -> None:
    # The static check above misses what a module pulls in through others; importing it does not.
    code = f"import sys, {module}; print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_old_sampling_path_still_works() -> None:
    import specsure
    from specsure.decode.sampling import SamplingParams, draw, probs_from_logits
    from specsure.sampling import SamplingParams as moved, draw as moved_draw

    assert SamplingParams is moved is specsure.SamplingParams and draw is moved_draw
    assert probs_from_logits.__module__ == "specsure.sampling.probs"


def test_the_old_sampling_module_exports_every_public_name() -> None:
    import specsure.decode.sampling as old
    import specsure.sampling as new

    public = set(new.__all__)
    assert "argmax_ids" in public and "SEED_LIMIT" in public
    assert public <= set(old.__all__) and all(getattr(old, n) is getattr(new, n) for n in public)
