#!/usr/bin/env python3
"""Print the layer tables of docs/architecture.md from the source.

Modules are counted as tests/layers.rs counts them: every file of src/ is a node
(src/fs/vfs.rs is `fs::vfs`, src/model/mod.rs is `model`); a file's imports are the
modules its `crate::` paths name (tests and comments included), its `super::` paths
(outside an inline `mod tests`) and the child modules it names (`child::X`), each
resolved to the longest module path that exists. `error` is left out (every module uses
it); `fuser::` marks the FUSE library. main.rs, lib.rs, src/bin/ and src/preload/ (the interception
library's own crate) are front ends, not layers.

Printed: the table of top-level modules (children folded into their top-level module),
then, for each top-level module with child files, the table of its own children.
No dependencies:  python3 tests/layers_table.py [SRC_DIR]
"""
import os
import re
import sys

SKIP = {"main", "lib", "bin", "preload"}
IDENT = re.compile(r"[A-Za-z0-9_]+(?:::[A-Za-z0-9_]+)*")


def module_of(rel):
    """src/a.rs and src/a/mod.rs are `a`, src/a/b.rs is `a::b`."""
    parts = rel.split(os.sep)
    stem = parts.pop()[:-3]
    if stem != "mod":
        parts.append(stem)
    return "::".join(parts)


def starts_path(text, i):
    """Whether the character before `i` does not continue an identifier or path."""
    return i == 0 or not (text[i - 1].isalnum() or text[i - 1] in "_:")


def path_after(text, at):
    m = IDENT.match(text, at)
    return m.group(0).split("::") if m else []


def longest(mods, path):
    for n in range(len(path), 0, -1):
        cand = "::".join(path[:n])
        if cand in mods:
            return cand
    return None


def read_files(src):
    """{module: (text, lines)} for every file that is a layer."""
    out = {}
    for root, _dirs, files in os.walk(src):
        for f in sorted(files):
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(root, f), src)
            top = rel.split(os.sep)[0]
            if top.endswith(".rs"):
                top = top[:-3]
            if top in SKIP:
                continue
            with open(os.path.join(root, f), encoding="utf-8") as fh:
                text = fh.read()
            out[module_of(rel)] = (text, rel)
    return out


def graph(texts):
    """{module: set of modules it imports}, as tests/layers.rs builds it."""
    mods = set(texts)
    g = {}
    for m, (text, _rel) in texts.items():
        own = m.split("::")
        parent = own[:-1]
        body_end = text.find("#[cfg(test)]\nmod tests")
        if body_end < 0:
            body_end = len(text)
        deps = set()

        def add(d):
            if d and d != m and d != "error" and not d.startswith("error::"):
                deps.add(d)

        for mt in re.finditer(r"crate::", text):
            if starts_path(text, mt.start()):
                add(longest(mods, path_after(text, mt.end())))
        for mt in re.finditer(r"super::", text[:body_end]):
            if not starts_path(text, mt.start()):
                continue
            p = list(parent)
            rest = path_after(text, mt.end())
            while rest and rest[0] == "super":
                rest.pop(0)
                if p:
                    p.pop()
            add(longest(mods, p + rest))
        prefix = m + "::"
        for c in mods:
            if c.startswith(prefix) and "::" not in c[len(prefix):]:
                name = c.rsplit("::", 1)[1]
                pat = name + "::"
                for mt in re.finditer(re.escape(pat), text[:body_end]):
                    i = mt.start()
                    if starts_path(text, i) or text[:i].endswith("self::"):
                        add(c)
                        break
        if "fuser::" in text and m != "fuse":
            deps.add("fuser")
        g[m] = deps
    return g


def levels(g):
    """0 for a node that uses none of the others; else 1 + its deepest import."""
    level = {}

    def depth(m, path=()):
        if m in level:
            return level[m]
        if m in path:  # a cycle: tests/layers.rs fails on it (or lists it); print anyway
            return 0
        ds = sorted(d for d in g[m] if d in g)  # sorted: the same levels every run
        level[m] = 1 + max((depth(d, path + (m,)) for d in ds), default=-1)
        return level[m]

    for m in sorted(g):
        depth(m)
    return level


def table(g, info, name_of, note=None):
    level = levels(g)
    used_by = {m: 0 for m in g}
    for _m, ds in g.items():
        for d in ds:
            if d in used_by:
                used_by[d] += 1
    print("| level | module | files | lines | uses | used by | modules it uses |")
    print("|---:|---|---:|---:|---:|---:|---|")
    for m in sorted(g, key=lambda m: (level[m], m)):
        files, lines = info[m]
        crate = sorted(d for d in g[m] if d != "fuser")
        listed = ", ".join(crate) if crate else "—"
        if "fuser" in g[m]:
            listed += " (and fuser)"
        users = "all (not counted)" if m == "error" else str(used_by[m])
        print(f"| {level[m]} | {name_of(m)} | {files} | {lines} | {len(crate)} | {users} | {listed} |")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "src")
    texts = read_files(src)
    g = graph(texts)

    def top(m):
        return m.split("::")[0]

    # Top-level table: children folded in.
    tg, tinfo = {}, {}
    for m, ds in g.items():
        t = top(m)
        tg.setdefault(t, set()).update(d if d == "fuser" else top(d) for d in ds if top(d) != t)
        f, l = tinfo.get(t, (0, 0))
        tinfo[t] = (f + 1, l + texts[m][0].count("\n"))

    def top_name(t):
        return f"`{t}/`" if os.path.isdir(os.path.join(src, t)) else f"`{t}.rs`"

    table(tg, tinfo, top_name)

    # One table per top-level module with children: its own files, imports among them.
    for t in sorted(tg):
        kids = sorted(m for m in g if top(m) == t)
        if len(kids) < 2:
            continue
        sg = {m: {d for d in g[m] if top(d) == t} for m in kids}
        sinfo = {m: (1, texts[m][0].count("\n")) for m in kids}
        print()
        print(f"#### `{t}` by file (imports among its own files)")
        print()
        table(sg, sinfo, lambda m: f"`{texts[m][1]}`")


if __name__ == "__main__":
    main()
