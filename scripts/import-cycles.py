#!/usr/bin/env python3
"""Fails when a crate's files import each other in a loop.

A file depends on another when it names that file's module or an item of it through a `crate::`,
`super::` or `self::` path (in a `use`, or inline): `use crate::ssr::{usage as report}` depends on
ssr/usage.rs as much as `use crate::ssr::usage::Report` does. A module's own descendants are its
parts, not its dependencies: a parent naming its child (a feature's `mod.rs` calling its
`#[cfg(feature = "ssr")] mod server`) is not an edge, exactly as an inline `mod server { ... }`
block is read as part of its file; the child naming its parent is. So the feature-module pattern
(child -> parent) passes and two siblings, cousins or unrelated files that import each other fail. A name that a `mod.rs`/`lib.rs` only re-exports (`pub use
child::Item`) counts as a dependency on the child that defines it, so a parent that re-exports its
children and children that use each other's items through the parent are judged by where the items
live. Cross-crate imports cannot loop (cargo forbids cyclic crates), so each crate is checked alone.

It also checks that server/src's top-level modules only import downwards (LAYERS below).

Usage: scripts/import-cycles.py [crate_src_dir ...]   (default: every workspace crate's src/)
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = ["types/src", "core/src", "app/src", "engine-sim/src", "server/src", "frontend/src"]

USE_RE = re.compile(r"\buse\s+([^;]+);", re.S)
INLINE_RE = re.compile(r"(?<![:\w])((?:crate|super|self)(?:::\w+)+)")
COMMENT_RE = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
STRING_RE = re.compile(r'"(?:\\.|[^"\\])*"')


def module_files(src):
    """Maps module path tuples to files: () -> lib.rs, ("a","b") -> a/b.rs or a/b/mod.rs."""
    mods = {}
    for dirpath, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, f), src)
            parts = rel[:-3].split(os.sep)
            if parts[-1] in ("mod", "lib", "main"):
                parts = parts[:-1]
            if rel == "main.rs":
                continue
            mods[tuple(parts)] = os.path.join(dirpath, f)
    return mods


def expand_use(tree):
    """`a::{b, c::{d, e as f}}` -> ["a::b", "a::c::d", "a::c::e"]."""
    tree = re.sub(r"\s+as\s+\w+", "", tree)
    tree = re.sub(r"\s+", "", tree)
    out = []

    def walk(prefix, s):
        i = s.find("{")
        if i < 0:
            out.extend(prefix + part for part in split_top(s))
            return
        head, body = s[:i], s[i + 1 : s.rfind("}")]
        for part in split_top(body):
            walk(prefix + head, part)

    walk("", tree)
    return [p.rstrip(":") for p in out if p]


def split_top(s):
    parts, depth, cur = [], 0, ""
    for ch in s:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur:
        parts.append(cur)
    return parts


def resolve(path, here, mods):
    """A `crate::`/`super::`/`self::` path seen in module `here` -> (module tuple, first item name)."""
    segs = path.split("::")
    if segs[0] == "crate":
        base, rest = (), segs[1:]
    elif segs[0] in ("super", "self"):
        base = list(here)
        while segs and segs[0] in ("super", "self"):
            if segs[0] == "super":
                base = base[:-1]
            segs = segs[1:]
        base, rest = tuple(base), segs
    else:
        return None
    mod = base
    i = 0
    while i < len(rest) and mod + (rest[i],) in mods:
        mod = mod + (rest[i],)
        i += 1
    item = rest[i] if i < len(rest) else None
    return mod, item


INLINE_MOD_RE = re.compile(r"\bmod\s+(\w+)\s*\{")


def split_inline_mods(text, mod):
    """Cuts `mod name { ... }` blocks (e.g. `mod tests`) out of a file's text: their `super::` is
    the file itself, so each block is read as the module `mod + (name,)`. Returns the file's own
    text and [(module path, block text)]."""
    blocks = []
    while True:
        m = INLINE_MOD_RE.search(text)
        if not m:
            return text, blocks
        depth, i = 0, m.end() - 1
        while i < len(text):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    break
            i += 1
        inner, rest = split_inline_mods(text[m.end() : i], mod + (m.group(1),))
        blocks.append((mod + (m.group(1),), inner))
        blocks.extend(rest)
        text = text[: m.start()] + text[i + 1 :]


def descendant(target, mod):
    """`target` is a module below `mod` (its child, grandchild, ...): one of `mod`'s parts."""
    return len(target) > len(mod) and target[: len(mod)] == mod


def graph(src):
    """Module -> set of modules (files) it names an item of."""
    mods = module_files(src)
    texts = {}
    for mod, f in mods.items():
        with open(f) as fh:
            text = COMMENT_RE.sub("", fh.read())
        texts[mod] = STRING_RE.sub('""', text)
    # Which child defines a name a parent re-exports.
    reexports = {}
    for mod, text in texts.items():
        for m in re.finditer(r"\bpub(?:\([^)]*\))?\s+use\s+([^;]+);", text, re.S):
            for p in expand_use(m.group(1)):
                name = p.split("::")[-1]
                full = p if p.split("::")[0] in ("crate", "super", "self") else "self::" + p
                r = resolve(full, mod, mods)
                if r and r[0] != mod:
                    reexports[(mod, name)] = r[0]
    edges = {mod: set() for mod in mods}
    for file_mod, whole in texts.items():
        own, blocks = split_inline_mods(whole, file_mod)
        for mod, text in [(file_mod, own)] + blocks:
            paths = []
            for m in USE_RE.finditer(text):
                for p in expand_use(m.group(1)):
                    if p.split("::")[0] in ("crate", "super", "self"):
                        paths.append(p)
                    elif p.split("::")[0] in {k[-1] for k in mods if len(k) == len(mod) + 1 and k[:-1] == mod}:
                        paths.append("self::" + p)
            paths += INLINE_RE.findall(USE_RE.sub("", text))
            for p in paths:
                r = resolve(p, mod, mods)
                if not r:
                    continue
                target, item = r
                while target not in mods:  # inside an inline module: its file
                    target = target[:-1]
                seen = set()
                while (target, item) in reexports and (target, item) not in seen:
                    seen.add((target, item))
                    target = reexports[(target, item)]
                # `item is None`: the path names a module (`use crate::ssr::usage as report`).
                if target != file_mod and not descendant(target, file_mod):
                    edges[file_mod].add(target)
    return edges, mods


def check(src):
    src = os.path.join(ROOT, src)
    if not os.path.isdir(src):
        return []
    edges, mods = graph(src)
    return cycles(edges, mods, src)


def cycles(edges, mods, src):
    """Tarjan's strongly connected components; every component of two or more files is a loop."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
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
                out.append(comp)

    sys.setrecursionlimit(10000)
    for v in edges:
        if v not in index:
            strong(v)
    report = []
    for comp in out:
        names = sorted(os.path.relpath(mods[m], ROOT) for m in comp)
        links = sorted(
            f"{os.path.relpath(mods[a], ROOT)} -> {os.path.relpath(mods[b], ROOT)}"
            for a in comp
            for b in edges[a]
            if b in comp
        )
        report.append((names, links))
    return report


# The layers of server/src, lowest first (see the opening doc comment of server/src/lib.rs). A
# top-level module may import modules of lower layers, and modules listed before it in its own
# layer; a module importing one listed later, or one of a higher layer, fails the check.
LAYERS = [
    ("domain", ["secret", "fd_limit", "endpoint", "base_tokenizer", "engine_policy", "usage"]),
    ("stores", ["redis_conn", "usage_store", "journal"]),
    ("logic", ["telemetry", "quota", "bodies", "metering", "adapter_check", "fleet", "lifecycle", "billing"]),
    ("edges", ["gateway", "api", "http_server", "body_bounds", "portal", "notify", "replica_report", "health"]),
    ("assembly", ["metrics_scrape", "app", "demo", "sim", "cli", "db_start", "admin", "serve"]),
]
LAYERED = "server/src"
# Upward imports tolerated (importing module, imported module): none.
KNOWN_EXCEPTIONS = set()


def layer_violations(src):
    """Imports between server/src's top-level modules that point up (or sideways against the
    order within a layer), and top-level modules missing from LAYERS."""
    rank = {}
    for i, (_, names) in enumerate(LAYERS):
        for j, name in enumerate(names):
            rank[name] = (i, j)
    edges, mods = graph(os.path.join(ROOT, src))
    problems = []
    for mod in mods:
        if len(mod) >= 1 and mod[0] not in rank:
            problems.append(f"module {mod[0]} is in no layer of LAYERS (scripts/import-cycles.py)")
    seen = set()
    for a, targets in edges.items():
        for b in targets:
            if not a or not b or a[0] == b[0] or a[0] not in rank or b[0] not in rank:
                continue
            if rank[b[0]] > rank[a[0]] and (a[0], b[0]) not in KNOWN_EXCEPTIONS:
                key = (a, b)
                if key in seen:
                    continue
                seen.add(key)
                la, lb = LAYERS[rank[a[0]][0]][0], LAYERS[rank[b[0]][0]][0]
                problems.append(
                    f"layer: {os.path.relpath(mods[a], ROOT)} ({a[0]}, {la}) imports "
                    f"{os.path.relpath(mods[b], ROOT)} ({b[0]}, {lb})"
                )
    return sorted(set(problems))


def main():
    dirs = sys.argv[1:] or DEFAULT
    found = False
    for d in dirs:
        for names, links in check(d):
            found = True
            print(f"import cycle in {d}: {', '.join(names)}")
            for link in links:
                print(f"    {link}")
        if os.path.normpath(d) == LAYERED:
            for problem in layer_violations(d):
                found = True
                print(problem)
    if found:
        sys.exit(1)
    layered = any(os.path.normpath(d) == LAYERED for d in dirs)
    print("no import cycles in " + ", ".join(dirs) + (f"; {LAYERED} follows LAYERS" if layered else ""))


if __name__ == "__main__":
    main()
