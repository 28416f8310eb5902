#!/usr/bin/env python3
"""Print the layer table of docs/architecture.md: for each top-level module of src/ (its
children folded in), the crate modules it references.

Counted as tests/layers.rs counts them: every `crate::NAME` in a module's files (tests and
comments included) is a use of NAME; `error` and the module itself are left out; `fuser::`
marks the FUSE library. main.rs, lib.rs and src/bin/ are front ends, not layers.
No dependencies:  python3 tests/layers_table.py [SRC_DIR]
"""
import os
import re
import sys

SKIP = {"main", "lib", "bin"}


def modules(src):
    """{top module: (files, lines, set of referenced modules)}"""
    out = {}
    for root, _dirs, files in os.walk(src):
        for f in sorted(files):
            if not f.endswith(".rs"):
                continue
            path = os.path.join(root, f)
            rel = os.path.relpath(path, src)
            top = rel.split(os.sep)[0]
            if top.endswith(".rs"):
                top = top[:-3]
            if top in SKIP:
                continue
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
            n_files, n_lines, deps = out.get(top, (0, 0, set()))
            for name in re.findall(r"crate::([A-Za-z0-9_]*)", text):
                if name and name != top and name != "error":
                    deps.add(name)
            if "fuser::" in text:
                deps.add("fuser")
            out[top] = (n_files + 1, n_lines + text.count("\n"), deps)
    return out


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "src")
    mods = modules(src)
    used_by = {m: 0 for m in mods}
    for _m, (_f, _l, deps) in mods.items():
        for d in deps:
            if d in used_by:
                used_by[d] += 1
    level = {}

    def depth(m, path=()):
        """0 for a module that uses none of the others; else 1 + its deepest import."""
        if m in level:
            return level[m]
        if m in path:  # a cycle: tests/layers.rs fails on it; print something anyway
            return 0
        deps = [d for d in mods[m][2] if d in mods]
        level[m] = 1 + max((depth(d, path + (m,)) for d in deps), default=-1)
        return level[m]

    order = sorted(mods, key=lambda m: (depth(m), m))
    print("| level | module | files | lines | uses | used by | `crate::` modules it uses |")
    print("|---:|---|---:|---:|---:|---:|---|")
    for m in order:
        files, lines, deps = mods[m]
        name = f"`{m}/`" if os.path.isdir(os.path.join(src, m)) else f"`{m}.rs`"
        crate = sorted(d for d in deps if d != "fuser")
        listed = ", ".join(crate) if crate else "—"
        if "fuser" in deps:
            listed += " (and fuser)"
        users = "all (not counted)" if m == "error" else str(used_by[m])
        print(f"| {level[m]} | {name} | {files} | {lines} | {len(crate)} | {users} | {listed} |")

if __name__ == "__main__":
    main()
