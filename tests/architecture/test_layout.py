"""drmas_train's and drmas_envs's layering is true: every import points down the floors of docs/architecture.md, and
no modules import each other in a circle. Every import counts: module level, function level and ``TYPE_CHECKING`` ones.

The floors, bottom first (a part may import its own modules and any floor below, never one above, and never another
part of its own floor): :data:`FLOORS` for drmas_train, :data:`ENV_FLOORS` for drmas_envs.
"""

from __future__ import annotations

import ast
from pathlib import Path

import drmas_envs
import drmas_train

PACKAGE = Path(drmas_train.__file__).resolve().parent
ENV_PACKAGE = Path(drmas_envs.__file__).resolve().parent

#: floor of each top-level part of drmas_train, bottom first; one part per floor (docs/architecture.md).
FLOORS = (
    "errors",  # the error types every stage raises (ConfigError)
    "data",  # data preparation (drmas data): reads drmas_envs only
    "model",  # model specs, loading, prefill, log-probs, LM head
    "backends",  # generation engines over loaded models (HF, vLLM, OpenAI client) and their factory
    "collect",  # the lock-step rollout, samples, task sampler
    "algorithm",  # advantages, losses, the PPO update and its typed settings, optimizers
    "eval",  # evaluation, metrics, results, leaderboards, LLM players
    "serving",  # the OpenAI-compatible server
    "distributed",  # Ray worker groups, data-parallel ranks, vLLM workers
    "run",  # the training loop, its config, checkpoints, run directory, metrics log
    "integrations",  # recipes for other RL libraries
    "commands",  # one module per `drmas` subcommand
    "cli",  # the `drmas` dispatcher
)
RANK = {name: i for i, name in enumerate(FLOORS)}

#: floor of each top-level part of drmas_envs, bottom first; parts on one floor never import each other. Derived from
#: the import graph (docs/architecture.md, "drmas_envs's floors").
ENV_FLOORS = (
    "_rng",  # the guard that leaves random / numpy's global state as it was
    "core",  # the text AEC base, spaces, Task, the episode record, tags, env factories
    "data",  # task sources (files, Hugging Face, reasoning-gym) and row formats; never imports search
    ("math", "search", "games"),  # the envs; none imports another, none registers itself
    "registration",  # make / register / spec: names an env by its "module:attr" entry point, imported when made
    ("_builtin", "wrappers"),  # the built-in ids; adapters for other libraries (Gymnasium's "drmas/<id>")
    "testing",  # conformance checks over any env
)


def _ranks(floors: tuple[str | tuple[str, ...], ...]) -> dict[str, int]:
    """Part -> floor number; a floor is one part or a tuple of parts."""
    return {part: i for i, floor in enumerate(floors) for part in ((floor,) if isinstance(floor, str) else floor)}


def _part(module: str) -> str | None:
    """The top-level part of drmas_train that ``module`` belongs to (None for the package root or outside it)."""
    parts = module.split(".")
    return parts[1] if parts[0] == "drmas_train" and len(parts) > 1 else None


def _module_name(path: Path, package: Path) -> str:
    rel = path.relative_to(package.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _imports(path: Path, modules: set[str]) -> list[tuple[int, str]]:
    """(line, module) of every package module ``path`` imports, at any depth; ``from pkg import name`` counts as
    ``pkg.name`` when that is a module of the package, else as ``pkg``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                found.append((node.lineno, sub if sub in modules else node.module))
    return [(line, m) for line, m in found if m in modules]


def check_layout(package: Path, floors: tuple[str | tuple[str, ...], ...] = FLOORS) -> list[str]:
    """Every violation of the layering in the package at ``package``: an import that points up a floor, one between
    two parts of the same floor (sideways), a part with no floor, and every circle of module imports.

    Returns:
        one line per violation, naming the importing file and line, the imported module and both floors.
    """
    rank = _ranks(floors)
    name = package.name
    files = {_module_name(p, package): p for p in sorted(package.rglob("*.py"))}
    modules = set(files)
    problems, graph = [], {}
    for mod, path in files.items():
        part = mod.split(".")[1] if "." in mod else None
        if part is not None and part not in rank:
            problems.append(f"{path.relative_to(package.parent)}: '{part}' is on no floor; add it to FLOORS")
            continue
        edges = set()
        for line, imported in _imports(path, modules):
            if imported == mod or imported == name:
                continue
            edges.add(imported)
            target = imported.split(".")[1]
            if part is None or target == part or target not in rank:
                continue
            if rank[target] > rank[part]:
                problems.append(f"{path.relative_to(package.parent)}:{line} ({part}, floor {rank[part]}) imports "
                                f"{imported} ({target}, floor {rank[target]}): an upward import")  # fmt: skip
            elif rank[target] == rank[part]:
                problems.append(f"{path.relative_to(package.parent)}:{line} ({part}, floor {rank[part]}) imports "
                                f"{imported} ({target}, the same floor): a sideways import")  # fmt: skip
        graph[mod] = edges
    problems += [f"import circle: {' -> '.join(c)} -> {c[0]}" for c in _circles(graph)]
    return problems


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each as a list of modules."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_imports_point_down_and_never_in_a_circle():
    problems = check_layout(PACKAGE)
    assert not problems, "\n".join(problems)


def test_drmas_envs_imports_point_down_and_never_in_a_circle():
    problems = check_layout(ENV_PACKAGE, ENV_FLOORS)
    assert not problems, "\n".join(problems)


def test_every_drmas_envs_part_is_on_a_floor():
    parts = {p.name.removesuffix(".py") for p in ENV_PACKAGE.iterdir() if p.name != "__init__.py"}
    parts = {p for p in parts if (ENV_PACKAGE / p / "__init__.py").is_file() or (ENV_PACKAGE / f"{p}.py").is_file()}
    assert parts == set(_ranks(ENV_FLOORS))


def test_a_sideways_import_between_envs_is_caught(tmp_path):
    root = tmp_path / "drmas_envs"
    for rel, text in {"__init__.py": "", "core/__init__.py": "", "math/__init__.py": "", "search/__init__.py": "",
                      "math/team.py": "from drmas_envs.search.parsing import parse_verdict\n",
                      "search/parsing.py": "from drmas_envs.core import Task\n"}.items():  # fmt: skip
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    assert check_layout(root, (("_rng",), "core", ("math", "search"))) == [
        "drmas_envs/math/team.py:1 (math, floor 2) imports drmas_envs.search.parsing (search, the same floor): "
        "a sideways import"
    ]


def test_drmas_envs_never_imports_drmas_train():
    """``drmas_train`` depends on ``drmas_envs``, never the reverse (docs/architecture.md)."""
    wrong = []
    for path in sorted(ENV_PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            if any(n.split(".")[0] == "drmas_train" for n in names):
                wrong.append(f"{path.relative_to(ENV_PACKAGE.parent)}:{node.lineno} imports drmas_train")
    assert not wrong, "\n".join(wrong)


def test_docs_drmas_envs_floor_table_is_env_floors():
    """docs/architecture.md's "drmas_envs's floors" table gives each floor's parts as ENV_FLOORS does."""
    import re

    doc = (PACKAGE.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = doc.split("### drmas_envs's floors", 1)[1].split("\n#", 1)[0]
    rows = re.findall(r"^\| (\d+) \| (.*?) \|", section, re.M)
    table = [tuple(re.findall(r"`drmas_envs\.([a-z_]+)`", parts)) for _, parts in rows]
    assert [int(n) for n, _ in rows] == list(range(len(ENV_FLOORS)))
    assert table == [(f,) if isinstance(f, str) else f for f in ENV_FLOORS]


def test_every_part_is_on_a_floor():
    parts = {p.name.removesuffix(".py") for p in PACKAGE.iterdir() if not p.name.startswith(("_", "."))}
    parts = {p for p in parts if (PACKAGE / p).is_dir() or (PACKAGE / f"{p}.py").is_file()}
    parts.discard("configs")  # package data (YAML presets), no code
    assert parts == set(FLOORS)


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "drmas_train"
    for rel, text in {"__init__.py": "", **files}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_an_injected_upward_import_is_caught_with_its_place(tmp_path):
    root = _tree(tmp_path, {
        "model/__init__.py": "", "model/models.py": "def load():\n    from drmas_train.run.trainer import train\n",
        "run/__init__.py": "", "run/trainer.py": "from drmas_train.model.models import load\n",
    })  # fmt: skip
    assert check_layout(root) == [
        "drmas_train/model/models.py:2 (model, floor 2) imports drmas_train.run.trainer (run, floor 9): an upward import",
        "import circle: drmas_train.model.models -> drmas_train.run.trainer -> drmas_train.model.models",
    ]


def test_a_function_level_circle_inside_one_part_is_caught(tmp_path):
    root = _tree(tmp_path, {
        "data/__init__.py": "",
        "data/prepare.py": "from drmas_train.data.recipes import RECIPES\n",
        "data/recipes.py": "def build():\n    from drmas_train.data import prepare\n",
    })  # fmt: skip
    assert check_layout(root) == ["import circle: drmas_train.data.prepare -> drmas_train.data.recipes -> drmas_train.data.prepare"]


def _ray_imports(path: Path) -> list[tuple[int, bool]]:
    """(line, at module level) of every ``import ray`` / ``from ray... import`` in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top = {id(n) for n in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots = [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            roots = [(node.module or "").split(".")[0]]
        else:
            continue
        if "ray" in roots:
            found.append((node.lineno, id(node) in top))
    return found


def test_ray_is_imported_at_module_top_in_distributed_and_nowhere_else():
    """``import ray`` lives at the top of distributed/ modules; the RLlib recipe (integrations/rllib_ppo.py) is the one
    other user, and imports RLlib lazily so that drmas_train.integrations loads without it."""
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        for line, top in _ray_imports(path):
            if rel.startswith("drmas_train/distributed/") and not top:
                wrong.append(f"{rel}:{line}: import ray inside a function (distributed/ imports it at module top)")
            elif not rel.startswith(("drmas_train/distributed/", "drmas_train/integrations/rllib_ppo.py")):
                wrong.append(f"{rel}:{line}: imports ray outside distributed/")
    assert not wrong, "\n".join(wrong)


def test_docs_floor_table_is_the_code():
    """docs/architecture.md's floor table names each part on its floor and every module of it (commands excepted:
    one module per subcommand)."""
    import re

    doc = (PACKAGE.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = {m.group(2): (int(m.group(1)), m.group(3)) for m in
            re.finditer(r"^\| (\d+) \| `([a-z_]+)/?(?:\.py)?` \|\s*(.*?)\s*\| ", doc, re.M)}  # fmt: skip
    assert [part for part, _ in sorted(rows.items(), key=lambda kv: kv[1][0])] == list(FLOORS)
    for part, (_, modules) in rows.items():
        folder = PACKAGE / part
        if not folder.is_dir() or part == "commands":
            continue
        names = {p.stem for p in folder.glob("*.py") if not p.name.startswith("_")}
        assert not {n for n in names if f"`{n}`" not in modules}, f"docs/architecture.md: {part}/ lists not every module"
