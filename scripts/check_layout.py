#!/usr/bin/env python3
"""Checks the house's layout: no module imports its way back to itself, no file too long to hold.

Cycles. For every Cargo crate under crates/ and every Python package under python/ and apps/,
it reads which module names which (Rust: `use` trees and `crate::`/`super::`/`self::`/child
paths of non-test code, through re-exports; Python: every `import`, including those inside
functions, through re-exports of `__init__`), then looks at each module's children as a graph
of their own: its own body (`mod.rs`, `lib.rs`, `__init__.py`: "(self)") and each child
subtree, an edge wherever code in one names an item in another. A strongly connected part of
any such graph is a cycle: it is printed with one edge of each pair and the file and line that
makes it. Test code (`#[cfg(test)]` items, `tests/`) is not read.

Layers. The worker's crates depend on each other in one direction only (docs/architecture.md),
and the engine on no HTTP crate: [`LAYERS`] lists, for each crate, the crates it must not
depend on, directly or through the workspace's own crates (`[dependencies]` only).

Length. No hand-written source file (.rs, .py, .c, .h, .go, .js, .sh) over --max-lines lines
(700); a file whose first lines say `Code generated ... DO NOT EDIT` is generated and exempt.

    python3 scripts/check_layout.py            # both checks; exit 1 on a cycle or a long file
    python3 scripts/check_layout.py --graph    # also every module's graph of children
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field

MAX_LINES = 700
SOURCE_SUFFIXES = (".rs", ".py", ".c", ".h", ".go", ".js", ".sh")
GENERATED = re.compile(r"Code generated .* DO NOT EDIT")
SELF = "(self)"

HTTP = {"axum", "hyper", "hyper-util", "hyper-staticfile", "http", "http-body-util", "tower", "tower-http"}
FEATURES = {"sprout-offload", "sprout-triggers", "sprout-sites"}
ABOVE_FEATURES = {"sprout-api", "sprout-worker", "sprout-cli"}
# crate -> what its [dependencies] must not name
LAYERS = {
    "sprout-engine": HTTP | FEATURES | ABOVE_FEATURES | {"sprout-fleet"},
    "sprout-offload": HTTP | (FEATURES - {"sprout-offload"}) | ABOVE_FEATURES,
    "sprout-triggers": HTTP | (FEATURES - {"sprout-triggers"}) | ABOVE_FEATURES,
    "sprout-sites": HTTP | (FEATURES - {"sprout-sites"}) | ABOVE_FEATURES,
    "sprout-api": {"sprout-worker", "sprout-cli"},
}


@dataclass
class Module:
    """One module: its path from the package root, its file, and what its own body names."""

    path: tuple[str, ...]
    file: str
    children: dict[str, Module] = field(default_factory=dict)
    # name -> (absolute path it is bound to, line) for every `use`/import binding in the body
    bindings: dict[str, tuple[tuple[str, ...], int]] = field(default_factory=dict)
    globs: list[tuple[str, ...]] = field(default_factory=list)
    # (absolute path named, line): every reference the body makes
    refs: list[tuple[tuple[str, ...], int]] = field(default_factory=list)
    defined: set[str] = field(default_factory=set)
    # Rust only, while reading: the body's text (inline modules cut out) and its `use` trees
    text: str = ""
    uses: list[tuple[list[str], str | None, int]] = field(default_factory=list)


@dataclass
class Package:
    name: str
    root: Module


# ---------------------------------------------------------------------------------- Rust


def strip_rust(text: str) -> str:
    """The text with comments, strings and char literals blanked, newlines kept."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            i = j
            continue
        if text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
            continue
        raw = re.match(r'b?r(#*)"', text[i:i + 260]) if c in "br" and (i == 0 or not _ident(text[i - 1])) else None
        if raw:
            end = '"' + raw.group(1)
            j = text.find(end, i + raw.end())
            j = n if j < 0 else j + len(end)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
            continue
        if c == '"' or (c == "b" and text.startswith('b"', i) and (i == 0 or not _ident(text[i - 1]))):
            j = i + (2 if c == "b" else 1)
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""' + re.sub(r"[^\n]", " ", text[i + 2:j + 1]))
            i = j + 1
            continue
        if c == "'":
            m = re.match(r"'(\\.[^']*|[^'\\])'", text[i:i + 12])
            if m:
                out.append(" " * len(m.group(0)))
                i += len(m.group(0))
                continue
        out.append(c)
        i += 1
    return "".join(out)


def _ident(c: str) -> bool:
    return c.isalnum() or c == "_"


def _block_end(text: str, i: int) -> int:
    """Index just past the item starting at i: its `;` at depth 0 or its closing brace."""
    depth = 0
    n = len(text)
    while i < n:
        c = text[i]
        if c in "{([":
            depth += 1
        elif c in "})]":
            depth -= 1
            if depth == 0 and c == "}":
                return i + 1
        elif c == ";" and depth == 0:
            return i + 1
        i += 1
    return n


TEST_CFG = re.compile(r"#\[cfg\((test|all\(test\b[^\]]*)\)\]")


def drop_test_items(text: str) -> str:
    """Blanks every item under `#[cfg(test)]` (keeping newlines, so lines still count)."""
    while True:
        m = TEST_CFG.search(text)
        if not m:
            return text
        j = m.end()
        while True:  # further attributes on the same item
            a = re.match(r"\s*#\[", text[j:])
            if not a:
                break
            j = _block_end(text, j + a.end() - 1)
        end = _block_end(text, j)
        text = text[:m.start()] + re.sub(r"[^\n]", " ", text[m.start():end]) + text[end:]


def parse_use_tree(tree: str) -> list[tuple[list[str], str | None]]:
    """`a::{b, c::d as e, f::*}` -> [(['a','b'], 'b'), (['a','c','d'], 'e'), (['a','f','*'], None)]."""
    tokens = re.findall(r"::|[{},*]|[A-Za-z_][A-Za-z0-9_]*", tree)
    results: list[tuple[list[str], str | None]] = []
    pos = 0

    def tree_at(prefix: list[str]) -> None:
        nonlocal pos
        path = list(prefix)
        while pos < len(tokens):
            tok = tokens[pos]
            if tok == "::":
                pos += 1
            elif tok == "{":
                pos += 1
                while pos < len(tokens) and tokens[pos] != "}":
                    tree_at(path)
                    if pos < len(tokens) and tokens[pos] == ",":
                        pos += 1
                pos += 1
                return
            elif tok == "*":
                pos += 1
                results.append((path + ["*"], None))
                return
            elif tok in (",", "}"):
                break
            elif tok == "as":
                alias = tokens[pos + 1]
                pos += 2
                results.append((_drop_self(path), None if alias == "_" else alias))
                return
            else:
                path.append(tok)
                pos += 1
        if len(path) > len(prefix):
            kept = _drop_self(path)
            results.append((kept, kept[-1]))

    tree_at([])
    return results


def _drop_self(path: list[str]) -> list[str]:
    return path[:-1] if len(path) > 1 and path[-1] == "self" else path


USE = re.compile(r"(?:\bpub(?:\s*\([^)]*\))?\s+)?\buse\s+([^;]+);")
MOD_DECL = re.compile(r"(?:\bpub(?:\s*\([^)]*\))?\s+)?\bmod\s+([A-Za-z_][A-Za-z0-9_]*)\s*([;{])")
PATH_EXPR = re.compile(r"(?<![A-Za-z0-9_:])(?:::)?((?:[A-Za-z_][A-Za-z0-9_]*::)+[A-Za-z_][A-Za-z0-9_]*)")
ITEM_DEF = re.compile(
    r"\b(?:fn|struct|enum|trait|type|const|static|union)\s+([A-Za-z_][A-Za-z0-9_]*)|macro_rules!\s*([A-Za-z_][A-Za-z0-9_]*)"
)


def _line_of(text: str, idx: int) -> int:
    return text.count("\n", 0, idx) + 1


def load_rust_module(path: tuple[str, ...], file: str, text: str, child_dir: str) -> Module:
    module = Module(path, file)
    body = list(text)
    cut_until = -1
    for m in MOD_DECL.finditer(text):
        name, kind = m.group(1), m.group(2)
        if m.start() < cut_until:
            continue  # inside an inline module read already
        if kind == "{":
            end = _block_end(text, m.end() - 1)
            padded = "\n" * (_line_of(text, m.end()) - 1) + text[m.end():end - 1]
            module.children[name] = load_rust_module(path + (name,), file, padded, os.path.join(child_dir, name))
            cut_until = end
            for k in range(m.start(), end):
                if body[k] != "\n":
                    body[k] = " "
        else:
            candidates = [os.path.join(child_dir, name + ".rs"), os.path.join(child_dir, name, "mod.rs")]
            found = next((c for c in candidates if os.path.exists(c)), None)
            if found is None:
                raise SystemExit(f"{file}:{_line_of(text, m.start())}: mod {name}; has no file ({' or '.join(candidates)})")
            module.children[name] = read_rust_file(path + (name,), found, os.path.join(child_dir, name))
    module.text = "".join(body)
    for m in ITEM_DEF.finditer(module.text):
        module.defined.add(m.group(1) or m.group(2))
    return module


def read_rust_file(path: tuple[str, ...], file: str, child_dir: str) -> Module:
    with open(file, encoding="utf-8") as f:
        raw = f.read()
    return load_rust_module(path, file, drop_test_items(strip_rust(raw)), child_dir)


def resolve_rust_refs(root: Module) -> None:
    """Fills each module's bindings and refs with absolute paths (from the crate root)."""
    for module in walk(root):
        for m in USE.finditer(module.text):
            line = _line_of(module.text, m.start())
            module.uses.extend((segs, alias, line) for segs, alias in parse_use_tree(m.group(1)))
        module.text = USE.sub(lambda u: re.sub(r"[^\n]", " ", u.group(0)), module.text)
    for module in walk(root):
        for segs, alias, line in module.uses:
            absolute = absolutize(module, segs, use=True)
            if absolute is None:
                continue
            if segs[-1] == "*":
                module.globs.append(absolute[:-1])
                absolute = absolute[:-1]
            elif alias is not None:
                module.bindings[alias] = (absolute, line)
            module.refs.append((absolute, line))
    for module in walk(root):
        for m in PATH_EXPR.finditer(module.text):
            absolute = absolutize(module, m.group(1).split("::"), use=False)
            if absolute is not None:
                module.refs.append((absolute, _line_of(module.text, m.start())))
        module.text = ""


def absolutize(module: Module, segs: list[str], use: bool) -> tuple[str, ...] | None:
    """A path as written in `module`, from the crate root; None for another crate's."""
    head = segs[0]
    if head == "crate":
        return tuple(segs[1:])
    if head in ("super", "self"):
        base = list(module.path)
        k = 0
        while k < len(segs) and segs[k] in ("super", "self"):
            if segs[k] == "super":
                base.pop()
            k += 1
        return tuple(base + segs[k:])
    if head in module.children:
        return module.path + tuple(segs)
    if not use and head in module.bindings:
        return module.bindings[head][0] + tuple(segs[1:])
    return None


# -------------------------------------------------------------------------------- Python


def read_python_package(root_dir: str, name: str) -> Module:
    """The package (a directory with __init__.py) or module (name.py) `name` in root_dir."""
    pkg_dir = os.path.join(root_dir, name)
    if os.path.isdir(pkg_dir):
        module = Module((name,), os.path.join(pkg_dir, "__init__.py"))
        for entry in sorted(os.listdir(pkg_dir)):
            full = os.path.join(pkg_dir, entry)
            if entry.endswith(".py") and entry != "__init__.py":
                child = entry[:-3]
                module.children[child] = _python_child(module.path + (child,), full, pkg_dir, child)
            elif os.path.isdir(full) and os.path.exists(os.path.join(full, "__init__.py")):
                module.children[entry] = _python_child(module.path + (entry,), None, pkg_dir, entry)
        return module
    return Module((name,), os.path.join(root_dir, name + ".py"))


def _python_child(path: tuple[str, ...], file: str | None, parent_dir: str, name: str) -> Module:
    if file is not None:
        return Module(path, file)
    sub = read_python_package(parent_dir, name)
    _reroot(sub, path)
    return sub


def _reroot(module: Module, path: tuple[str, ...]) -> None:
    module.path = path
    for name, child in module.children.items():
        _reroot(child, path + (name,))


def resolve_python_refs(root: Module, top: str) -> None:
    """Fills bindings and refs for every module of a package whose top-level name is `top`."""
    for module in walk(root):
        if not os.path.exists(module.file):
            continue
        with open(module.file, encoding="utf-8") as f:
            tree = ast.parse(f.read(), module.file)
        is_package = module.file.endswith("__init__.py")
        package = module.path if is_package else module.path[:-1]
        siblings = root_children(root, package)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                module.defined.add(node.name)
            # The in-sandbox runtime loads its modules by path, as `_sprout_<name>`
            # (`import _sprout_load`, `load.runtime_module("channel")`): edges to siblings.
            loaded = runtime_loads(node)
            if loaded in siblings and package[1:] + (loaded,) != module.path[1:]:
                module.refs.append((package[1:] + (loaded,), node.lineno))
            if isinstance(node, ast.Import):
                for alias in node.names:
                    segs = tuple(alias.name.split("."))
                    if segs[0] == top:
                        module.refs.append((segs[1:], node.lineno))
                        if alias.asname:
                            module.bindings[alias.asname] = (segs[1:], node.lineno)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[: len(package) - (node.level - 1)]
                    segs = base + tuple(node.module.split(".") if node.module else ())
                else:
                    segs = tuple((node.module or "").split("."))
                if not segs or segs[0] != top:
                    continue
                for alias in node.names:
                    if alias.name == "*":
                        module.globs.append(segs[1:])
                        module.refs.append((segs[1:], node.lineno))
                        continue
                    target = segs[1:] + (alias.name,)
                    module.refs.append((target, node.lineno))
                    if node.col_offset == 0:
                        module.bindings[alias.asname or alias.name] = (target, node.lineno)


def root_children(root: Module, package: tuple[str, ...]) -> set[str]:
    """The names of the modules in `package` (a path from the top, top included)."""
    found, _ = find(root, package[1:])
    return set(found.children)


def runtime_loads(node: ast.AST) -> str | None:
    """The sibling a node loads by the runtime's convention, if it does."""
    if isinstance(node, ast.Import) and len(node.names) == 1 and node.names[0].name.startswith("_sprout_"):
        return node.names[0].name.removeprefix("_sprout_")
    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("_sprout_"):
        return node.module.removeprefix("_sprout_")
    if (
        isinstance(node, ast.Call)
        and (getattr(node.func, "attr", None) or getattr(node.func, "id", None)) == "runtime_module"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    ):
        return node.args[0].value
    return None


# ------------------------------------------------------------------------------- graphs


def walk(module: Module) -> Iterable[Module]:
    yield module
    for child in module.children.values():
        yield from walk(child)


def find(root: Module, path: tuple[str, ...]) -> tuple[Module, tuple[str, ...]]:
    """The deepest module along path, and what of the path is left after it."""
    module = root
    for k, seg in enumerate(path):
        if seg in module.children:
            module = module.children[seg]
        else:
            return module, path[k:]
    return module, ()


def target_of(root: Module, path: tuple[str, ...], seen: frozenset = frozenset()) -> Module:
    """The module that holds the item a path names, following re-exports."""
    module, rest = find(root, path)
    if not rest or (module.path, rest[0]) in seen:
        return module
    seen = seen | {(module.path, rest[0])}
    name = rest[0]
    if name in module.bindings:
        return target_of(root, module.bindings[name][0] + rest[1:], seen)
    if name not in module.defined:
        for glob in module.globs:
            inner = target_of(root, glob + (name,), seen)
            if inner is not module and (name in inner.defined or name in inner.bindings):
                return inner
    return module


@dataclass
class Cycle:
    parent: tuple[str, ...]
    members: list[str]
    evidence: list[str]


def module_graphs(package: Package) -> tuple[dict[tuple[str, ...], dict[str, dict[str, tuple[str, int]]]], int]:
    """For each module with children: node -> node -> (file, line) of one reference."""
    graphs: dict[tuple[str, ...], dict[str, dict[str, tuple[str, int]]]] = {}
    root = package.root
    count = 0
    for module in walk(root):
        for ref, line in module.refs:
            target = target_of(root, ref)
            if target is module:
                continue
            src, dst = module.path, target.path
            k = 0
            while k < min(len(src), len(dst)) and src[k] == dst[k]:
                k += 1
            if k == len(src) and k == len(dst):
                continue
            parent = src[:k]
            a = src[k] if k < len(src) else SELF
            b = dst[k] if k < len(dst) else SELF
            graph = graphs.setdefault(parent, {})
            if b not in graph.setdefault(a, {}):
                graph[a][b] = (module.file, line)
                count += 1
    return graphs, count


def strongly_connected(graph: dict[str, dict[str, tuple[str, int]]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative; only parts of two or more nodes."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    parts: list[list[str]] = []
    nodes = sorted(set(graph) | {b for edges in graph.values() for b in edges})
    counter = 0
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, {}))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            advanced = False
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, {})))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                part = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    part.append(top)
                    if top == node:
                        break
                if len(part) > 1:
                    parts.append(sorted(part))
    return parts


def cycles_of(package: Package) -> tuple[list[Cycle], int, int]:
    graphs, edges = module_graphs(package)
    cycles = []
    for parent, graph in sorted(graphs.items()):
        for part in strongly_connected(graph):
            members = set(part)
            evidence = []
            for a in part:
                for b, (file, line) in sorted(graph.get(a, {}).items()):
                    if b in members:
                        evidence.append(f"{a} -> {b}  ({file}:{line})")
            cycles.append(Cycle(parent, part, evidence))
    modules = sum(1 for _ in walk(package.root))
    return cycles, modules, edges


# ------------------------------------------------------------------------------ packages


def rust_packages(repo: str) -> list[Package]:
    packages = []
    crates = os.path.join(repo, "crates")
    for crate in sorted(os.listdir(crates)):
        src = os.path.join(crates, crate, "src")
        for root_file in ("lib.rs", "main.rs"):
            path = os.path.join(src, root_file)
            if os.path.exists(path):
                root = read_rust_file((), path, src)
                resolve_rust_refs(root)
                packages.append(Package(f"crates/{crate}/src/{root_file}", root))
    return packages


def python_packages(repo: str) -> list[Package]:
    packages = []
    for base in ("python", "apps/olio"):
        base_dir = os.path.join(repo, base)
        for entry in sorted(os.listdir(base_dir)):
            full = os.path.join(base_dir, entry)
            if os.path.isdir(full) and os.path.exists(os.path.join(full, "__init__.py")):
                root = read_python_package(base_dir, entry)
                resolve_python_refs(root, entry)
                packages.append(Package(f"{base}/{entry}", root))
    return packages


def long_files(repo: str, limit: int) -> list[tuple[str, int]]:
    listed = subprocess.run(["git", "ls-files"], cwd=repo, capture_output=True, text=True, check=True).stdout.split()
    found = []
    for rel in listed:
        if not rel.endswith(SOURCE_SUFFIXES) or not os.path.isfile(os.path.join(repo, rel)):
            continue
        with open(os.path.join(repo, rel), encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
        if len(lines) > limit and not any(GENERATED.search(line) for line in lines[:5]):
            found.append((rel, len(lines)))
    return sorted(found, key=lambda item: -item[1])


def layer_breaches(repo: str) -> list[str]:
    """Each dependency a crate reaches that its layer forbids: named in its Cargo.toml's
    `[dependencies]`, or in those of a workspace crate it depends on (so the engine cannot
    reach hyper through a crate below it)."""
    deps: dict[str, set[str]] = {}
    manifests: dict[str, str] = {}
    crates = os.path.join(repo, "crates")
    for crate in sorted(os.listdir(crates)):
        manifest = os.path.join(crates, crate, "Cargo.toml")
        if not os.path.exists(manifest):
            continue
        with open(manifest, "rb") as f:
            cargo = tomllib.load(f)
        name = cargo.get("package", {}).get("name", crate)
        deps[name] = set(cargo.get("dependencies", {}))
        manifests[name] = f"crates/{crate}/Cargo.toml"
    breaches = []
    for name, forbidden in sorted(LAYERS.items()):
        if name not in deps:
            continue
        # (dependency, the chain of workspace crates through which it is reached)
        seen: dict[str, list[str]] = {}
        todo = [(dep, [name]) for dep in sorted(deps[name])]
        while todo:
            dep, chain = todo.pop(0)
            if dep in seen:
                continue
            seen[dep] = chain
            for below in sorted(deps.get(dep, ())):
                todo.append((below, chain + [dep]))
        for dep in sorted(set(seen) & forbidden):
            via = f" (through {' -> '.join(seen[dep][1:])})" if len(seen[dep]) > 1 else ""
            breaches.append(f"{manifests[name]}: {name} depends on {dep}{via}, which its layer must not")
    return breaches


def print_graph(package: Package) -> None:
    graphs, _ = module_graphs(package)
    for parent, graph in sorted(graphs.items()):
        print(f"  {'::'.join(parent) or '(root)'}:")
        for a in sorted(graph):
            print(f"    {a} -> {', '.join(sorted(graph[a]))}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parser.add_argument("--graph", action="store_true", help="print every module's graph of children")
    parser.add_argument("--max-lines", type=int, default=MAX_LINES)
    args = parser.parse_args(argv)
    failed = False
    total = 0
    for package in rust_packages(args.repo) + python_packages(args.repo):
        cycles, modules, edges = cycles_of(package)
        total += len(cycles)
        print(f"{package.name}: {modules} modules, {edges} edges, {len(cycles)} cycles")
        if args.graph:
            print_graph(package)
        for cycle in cycles:
            failed = True
            where = "::".join(cycle.parent) or "(root)"
            print(f"  cycle in {where} among {len(cycle.members)}: {', '.join(cycle.members)}")
            for line in cycle.evidence:
                print(f"    {line}")
    breaches = layer_breaches(args.repo)
    for breach in breaches:
        failed = True
        print(breach)
    long = long_files(args.repo, args.max_lines)
    for rel, count in long:
        failed = True
        print(f"{rel}: {count} lines, over {args.max_lines}")
    print(f"{total} module cycles; {len(breaches)} layer breaches; {len(long)} files over {args.max_lines} lines")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
