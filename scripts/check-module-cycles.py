#!/usr/bin/env python3
"""Fails on any import circle between the modules of a crate.

A module is a source file (`src/launch/agent.rs` is `launch::agent`, `src/launch/mod.rs` or
`src/launch.rs` is `launch`); modules written inline in a file (`mod tests { ... }`) belong to
their file. Module A imports module B when A's code names a path into B: `use crate::b::...`,
`crate::b::f()`, `super::b`, `self::b` (in `use` lines), or a child module named
without a prefix (`b::f()`), resolved to the longest module that
exists. Declaring `mod b;` is not an import. A circle is a strongly connected component of
two or more modules (A -> B -> ... -> A); each is printed with one edge of the circle and the
line that makes it. `pub use` lines (re-exports) are not imports.

Usage: scripts/check-module-cycles.py CRATE_DIR...   (exit 0: no circle; 1: circles; 2: usage)
"""

import re
import sys
from pathlib import Path

PATH = re.compile(r"\b((?:crate|super|self)(?:::(?:[A-Za-z_][A-Za-z0-9_]*|\{[^;]*?\}))+)")
BARE = re.compile(r"(?<![:\w])([a-z_][a-z0-9_]*)::((?:[A-Za-z_][A-Za-z0-9_]*)(?:::[A-Za-z_][A-Za-z0-9_]*)*)")
USE = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?use\b")
USE_OR_MOD = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?(use|mod)\b")


def module_of(src: Path, file: Path) -> tuple:
    rel = file.relative_to(src).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return tuple(parts)


def strip_comments_and_strings(text: str) -> str:
    """The code without comments, string and char literals (newlines kept, so that line
    numbers stay right)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, j = 0, i
            while j < n:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                    if depth == 0:
                        break
                else:
                    j += 1
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif (m := re.match(r'b?r(#*)"', text[i:])) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            end = text.find('"' + m.group(1), i + m.end())
            j = n if end < 0 else end + 1 + len(m.group(1))
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j + 1
        elif c == "'" and (m := re.match(r"'(?:\\.[^']*|[^'\\])'", text[i:])):
            # A char literal ('"', '\n', '\u{1F600}'); a lifetime ('a) has no closing quote.
            out.append("' '")
            i += m.end()
        else:
            out.append(c)
            i += 1
    return "".join(out)


def statements(text: str):
    """(line number, line) of the code, with each `use` statement that spans lines joined
    into one (`use super::{\n a,\n b,\n};`)."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line, start = lines[i], i + 1
        if USE.match(line):
            while ";" not in line and i + 1 < len(lines):
                i += 1
                line += " " + lines[i].strip()
        yield start, line
        i += 1


def expand(path: str) -> list:
    """`crate::a::{b, c::d}` -> [['crate','a','b'], ['crate','a','c','d']] (one level of braces
    is enough for the head module)."""
    m = re.match(r"^(.*?)::\{(.*)\}$", path, flags=re.S)
    if not m:
        return [[p for p in path.split("::") if p]]
    head = [p for p in m.group(1).split("::") if p]
    out = []
    depth, cur = 0, ""
    for ch in m.group(2) + ",":
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            item = cur.strip()
            if item:
                item = re.sub(r"\s+as\s+\w+$", "", item)
                out.extend(head + e for e in expand(item))
            cur = ""
        else:
            cur += ch
    return out or [head]


def resolve(segments: list, here: tuple, modules: set, file_is_dir_module: bool):
    base = list(here)
    i = 0
    if segments and segments[0] not in ("crate", "super", "self"):
        segments = ["self"] + segments
    if segments and segments[0] == "crate":
        base, i = [], 1
    else:
        # `super` in `a/b.rs` (module a::b) is `a`; `self` is `a::b`.
        while i < len(segments) and segments[i] in ("super", "self"):
            if segments[i] == "super":
                base = base[:-1]
            i += 1
    target = tuple(base)
    best = target if target in modules else None
    for seg in segments[i:]:
        target = target + (seg,)
        if target in modules:
            best = target
        else:
            break
    return best


def check_crate(crate: Path) -> list:
    src = crate / "src"
    files = sorted(src.rglob("*.rs"))
    modules = {module_of(src, f): f for f in files}
    names = set(modules)
    edges = {}  # (a, b) -> "file:line: text"
    for mod, f in modules.items():
        is_dir_module = f.name in ("mod.rs", "lib.rs", "main.rs")
        text = strip_comments_and_strings(f.read_text())
        for lineno, line in statements(text):
            if USE_OR_MOD.match(line) and line.split()[0:2][-1] == "mod":
                continue
            # A re-export (`pub use child::Item;`) is the module's public face, not its use of
            # the child: a crate root that re-exports and a child that names the root's error
            # type are no circle.
            if re.match(r"^\s*pub(?:\([^)]*\))?\s+use\b", line):
                continue
            for m in PATH.finditer(line):
                for segments in expand(m.group(1)):
                    if segments and segments[0] == "self" and not USE_OR_MOD.match(line):
                        continue
                    target = resolve(segments, mod, names, is_dir_module)
                    if target is None or target == mod:
                        continue
                    # A module naming its own ancestor through `crate::` paths to items the
                    # ancestor declares is still an import of that ancestor.
                    edges.setdefault((mod, target), f"{f.relative_to(crate)}:{lineno}: {line.strip()}")
            # A child module named without a prefix (`agent::run_agent()`, `use agent::X`).
            for m in BARE.finditer(line):
                target = resolve([m.group(1)] + m.group(2).split("::"), mod, names, False)
                if (mod + (m.group(1),)) in names and target not in (None, mod):
                    edges.setdefault((mod, target), f"{f.relative_to(crate)}:{lineno}: {line.strip()}")
    return find_cycles(names, edges)


def find_cycles(nodes: set, edges: dict) -> list:
    graph = {n: sorted({b for (a, b) in edges if a == n}) for n in nodes}
    index, low, stack, on, sccs = {}, {}, [], set(), []
    counter = [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
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
                sccs.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for n in sorted(nodes):
        if n not in index:
            strong(n)
    out = []
    for comp in sccs:
        inside = {(a, b): why for (a, b), why in edges.items() if a in comp and b in comp}
        out.append((comp, inside))
    return out


def name(mod: tuple) -> str:
    return "::".join(("crate",) + mod)


def main(argv: list) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    failed = False
    for arg in argv:
        crate = Path(arg)
        if not (crate / "src").is_dir():
            print(f"check-module-cycles: {crate}: no src/ directory", file=sys.stderr)
            return 2
        for comp, inside in check_crate(crate):
            failed = True
            print(f"check-module-cycles: {crate}: import circle between {', '.join(map(name, comp))}:")
            for (a, b), why in sorted(inside.items()):
                print(f"  {name(a)} -> {name(b)}   ({why})")
    if not failed:
        print(f"check-module-cycles: no import circle in {len(argv)} crates")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
