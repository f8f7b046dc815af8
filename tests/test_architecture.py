"""docs/ARCHITECTURE.md's folder map is a contract: its "imports" column is what each folder's
code imports of memq and spark_source (type-only imports included), and modules import no cycle."""

from __future__ import annotations

import ast
import re
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("memq", "spark_source")
NOTHING = {"—", "-", ""}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    """Every module of the checked packages by dotted name (a package by its __init__)."""
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _imported(path: Path, modules: dict[str, Path]) -> set[str]:
    """The memq/spark_source modules a file imports, anywhere in it (TYPE_CHECKING blocks too).
    `from a.b import c` imports module a.b.c when there is one, else a.b (its __init__)."""
    here = _module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                     for alias in node.names]
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != here:
                found.add(name)
    return found


def _part(module: str) -> str:
    """The folder-map part a module belongs to: `memq/broker/`, `memq/config.py`, `spark_source/`."""
    parts = module.split(".")
    if parts[0] != "memq":
        return f"{parts[0]}/"
    if len(parts) == 1:
        return "memq/__init__.py"
    is_package = (ROOT / "memq" / parts[1]).is_dir()
    return f"memq/{parts[1]}/" if is_package else f"memq/{parts[1]}.py"


def _short(part: str) -> str:
    """A part as the imports column names it: `broker`, `config`, `spark_source`."""
    return part.rstrip("/").removesuffix(".py").rpartition("/")[2]


def _code_imports() -> dict[str, dict[str, set[str]]]:
    """Folder -> each part it imports -> the modules of the folder that import it."""
    modules = _modules()
    table: dict[str, dict[str, set[str]]] = {}
    for name, path in modules.items():
        part = _part(name)
        if part == "memq/__init__.py":
            continue
        mine = table.setdefault(part, {})
        for m in _imported(path, modules):
            if _part(m) not in (part, "memq/__init__.py"):
                mine.setdefault(_short(_part(m)), set()).add(name)
    return table


def _documented_imports() -> dict[str, set[str]]:
    """Folder -> the parts its "imports" cell names: comma-separated, first word of each,
    `(remarks)` and backticks ignored; a dash means none."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    section = text.split("## Folder map", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        folder = cells[0].strip("`")
        if not folder.startswith(PACKAGES):
            continue                     # e.g. bench/, outside the shipped packages
        cell = re.sub(r"\([^)]*\)", "", cells[2]).replace("`", "")
        rows[folder] = {item.split()[0] for item in cell.split(",") if item.strip() not in NOTHING}
    return rows


def test_folder_map_imports_match_the_code() -> None:
    documented, actual = _documented_imports(), _code_imports()
    assert documented, "no folder map table found in docs/ARCHITECTURE.md"
    problems = []
    for folder in sorted(documented.keys() | actual.keys()):
        if folder not in actual:
            problems.append(f"{folder}: in the table, but no such module in the code")
        elif folder not in documented:
            problems.append(f"{folder}: no row in the table (imports {', '.join(sorted(actual[folder])) or '—'})")
        else:
            for part in sorted(actual[folder].keys() - documented[folder]):
                problems.append(f"{folder}: imports {part} (in {', '.join(sorted(actual[folder][part]))}), "
                                "which its row does not name")
            for part in sorted(documented[folder] - actual[folder].keys()):
                problems.append(f"{folder}: its row names {part}, which none of its modules imports")
    assert not problems, "docs/ARCHITECTURE.md folder map vs the code:\n" + "\n".join(problems)


def test_no_row_imports_a_row_below_it() -> None:
    """The dependency rule: the table's order is a layering, each row importing only rows above."""
    documented = _documented_imports()
    above: set[str] = set()
    upward = []
    for folder, imports in documented.items():
        below = sorted(imports - above - {_short(folder)})
        upward += [f"{folder} imports {part}, a row below it" for part in below]
        above.add(_short(folder))
    assert not upward, "\n".join(upward)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_cycle_finder_sees_a_cycle() -> None:
    """The check below can fail: a two-module loop and a three-module loop are found, a chain is not."""
    graph = {"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"e"}, "e": {"c"}, "f": {"a"}}
    assert sorted(_cycles(graph)) == [["a", "b"], ["c", "d", "e"]]


def test_no_import_cycles() -> None:
    modules = _modules()
    graph = {name: _imported(path, modules) for name, path in modules.items()}
    cycles = _cycles(graph)
    assert not cycles, "modules importing each other (directly or around a loop):\n" + "\n".join(
        " <-> ".join(c) for c in cycles)


#: The broker's assembly and its front doors; every other module of memq/broker/ is its core.
BROKER_OUTSIDE_CORE = ("memq.broker.server", "memq.broker.__main__", "memq.broker.doors")


def test_the_broker_core_never_imports_a_door() -> None:
    """Doors depend on the core's seam (memq.broker.seam), never the other way round."""
    modules = _modules()
    problems = []
    for name, path in modules.items():
        if not name.startswith("memq.broker.") or name.startswith(BROKER_OUTSIDE_CORE):
            continue
        for m in _imported(path, modules):
            if m.startswith(BROKER_OUTSIDE_CORE):
                problems.append(f"{name} imports {m}")
    assert not problems, "the broker core imports its assembly or a door:\n" + "\n".join(problems)


#: The Kafka door's API families: the modules of `doors/` declaring a `FAMILY` (`kafka_family` is
#: the base they share: what a family declares, `Conn`, `AdminCall`; `doors/kafka.py` the listener
#: registering them; a module without a FAMILY, such as `kafka_schema_check`, is one family's part).
DOORS = "memq.broker.doors."


def _declares_family(path: Path) -> bool:
    return any(isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "FAMILY" for t in node.targets)
               for node in ast.parse(path.read_text(), str(path)).body)


def _family_imports() -> set[tuple[str, str]]:
    """(family, family it imports) for every Kafka family module, from each one's `ast`."""
    modules = _modules()
    families = {n for n, p in modules.items() if n.startswith(DOORS) and _declares_family(p)}
    assert len(families) >= 10, families   # the rule checks something
    return {(name, m) for name in families for m in _imported(modules[name], modules) if m in families}


def test_no_kafka_family_imports_another() -> None:
    """A family maps its requests to the core and back: what two families share is the core's
    (`BrokerCore`) or `memq.kafka_api`'s, never one family's reached from another."""
    problems = sorted(_family_imports())
    assert not problems, "Kafka families importing each other:\n" + "\n".join(f"{a} imports {b}" for a, b in problems)


def test_tests_share_helpers_only_through_tests_support() -> None:
    """A test module imports no other test module, and support modules by their full name
    (`tests.support.x`): a bare `import waiting` works only from some working directories."""
    tests = ROOT / "tests"
    local = {p.stem for p in tests.glob("*.py")} | {p.stem for p in (tests / "support").glob("*.py")} | {"support"}
    problems = []
    for path in sorted(tests.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            for name in names:
                top = name.split(".")[0]
                if top in local or name.startswith("tests.test_"):
                    problems.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {name}")
    assert not problems, "import shared test helpers from tests.support:\n" + "\n".join(problems)
