//! The layers of src/ form no import cycle, and the core knows nothing of fuser: a
//! module's `crate::`, `super::` and child-module references are its imports
//! (docs/architecture.md lists the layers). Every file is a node of its own (src/fs/vfs.rs
//! is `fs::vfs`), so a cycle hidden among a module's children (a parent using a child
//! that uses the parent back, or two siblings using each other) fails as one between
//! top-level modules does.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

type Graph = BTreeMap<String, BTreeSet<String>>;

/// Module trees whose children still form cycles, being split by their owners. The test
/// fails once a tree listed here has none, so the list only shrinks.
const CHILD_CYCLES_LEFT: &[&str] = &[];

/// The filesystem core's modules, top down: each uses only modules of later rows.
const FS_LAYERS: &[&[&str]] = &[
    &["fs"],
    &["fs::write", "fs::zarr_write", "fs::gpu", "fs::extents"],
    &["fs::vfs"],
    &["fs::open"],
    &["fs::views"],
    &[
        "fs::views::backing",
        "fs::views::file_root",
        "fs::views::group",
        "fs::views::tiles",
        "fs::views::slices",
        "fs::views::zarr",
    ],
    &["fs::views::dataset"],
    &[
        "fs::zarr_view",
        "fs::pending_io",
        "fs::listing",
        "fs::buffers",
    ],
    &["fs::mount"],
    &["fs::inodes"],
    &["fs::node", "fs::access"],
    &["fs::attr"],
];

/// Every .rs file under `dir`, recursively.
fn rs_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            rs_files(&p, out);
        } else if p.extension().and_then(|x| x.to_str()) == Some("rs") {
            out.push(p);
        }
    }
}

/// The module path of a file: src/a.rs and src/a/mod.rs are `a`, src/a/b.rs is `a::b`.
fn module_of(rel: &Path) -> String {
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" {
        parts.push(stem.to_string());
    }
    parts.join("::")
}

/// The identifier path after `at` in `text` (`a::b::c` of `a::b::c::X`, without `X`
/// unless it names a module: resolved by the caller).
fn path_after(text: &str, at: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = &text[at..];
    loop {
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if name.is_empty() {
            break;
        }
        rest = &rest[name.len()..];
        out.push(name);
        match rest.strip_prefix("::") {
            Some(r) => rest = r,
            None => break,
        }
    }
    out
}

/// The paths named at `at`: `a::b::C` is one; `a::b::{c, d::E}` is `a::b::c` and
/// `a::b::d::E` (one level of braces).
fn paths_after(text: &str, at: usize) -> Vec<Vec<String>> {
    let head = path_after(text, at);
    let mut end = at;
    for seg in &head {
        end = text[end..]
            .find(seg.as_str())
            .map_or(end, |k| end + k + seg.len());
    }
    let rest = &text[end..];
    let group = rest.strip_prefix("::{").or_else(|| {
        if head.is_empty() {
            rest.strip_prefix('{')
        } else {
            None
        }
    });
    let Some(group) = group else {
        return vec![head];
    };
    let Some(close) = group.find('}') else {
        return vec![head];
    };
    let inner = &group[..close];
    inner
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty() && !t.starts_with('{'))
        .map(|t| {
            let mut p = head.clone();
            p.extend(path_after(t, 0));
            p
        })
        .collect()
}

/// The longest prefix of `path` that is a module of `mods`.
fn longest_module(mods: &BTreeSet<String>, path: &[String]) -> Option<String> {
    (1..=path.len())
        .rev()
        .map(|n| path[..n].join("::"))
        .find(|m| mods.contains(m))
}

/// Whether the character before `i` ends an identifier or path (so `i` does not start one).
fn starts_path(text: &str, i: usize) -> bool {
    text[..i]
        .chars()
        .next_back()
        .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
}

/// The names of the items a file defines (`pub` or not): `fn`, `struct`, `enum`,
/// `trait`, `type`, `const`, `static`, `mod`, `macro_rules!` at any depth of its text
/// before its inline tests.
fn items_defined(text: &str) -> BTreeSet<String> {
    let body = &text[..text.find("#[cfg(test)]\nmod tests").unwrap_or(text.len())];
    let mut out = BTreeSet::new();
    for kw in [
        "fn ", "struct ", "enum ", "trait ", "type ", "const ", "static ", "mod ",
    ] {
        for (i, _) in body.match_indices(kw) {
            if !starts_path(body, i) {
                continue;
            }
            let name = path_after(body, i + kw.len());
            if let Some(n) = name.first() {
                out.insert(n.clone());
            }
        }
    }
    out
}

fn modules() -> Graph {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rs_files(&src, &mut files);
    let mut texts = BTreeMap::new();
    for f in files {
        let rel = f.strip_prefix(&src).unwrap().to_path_buf();
        let top = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let top = top.trim_end_matches(".rs");
        // binaries are front ends, not layers of the core (src/bin holds the FUSE floor
        // of the read benchmark, a file system of its own; src/preload is the crate of
        // `h5tilefs run`'s interception library, which links no part of the core)
        if top == "main" || top == "lib" || top == "bin" || top == "preload" {
            continue;
        }
        let is_mod_rs = rel.file_name().is_some_and(|n| n == "mod.rs");
        texts.insert(
            module_of(&rel),
            (std::fs::read_to_string(&f).unwrap(), is_mod_rs),
        );
    }
    let mods: BTreeSet<String> = texts.keys().cloned().collect();
    let defined: BTreeMap<String, BTreeSet<String>> = texts
        .iter()
        .map(|(m, (text, _))| (m.clone(), items_defined(text)))
        .collect();
    // `a::b::Item` where `a::b` only re-exports `Item` from its child `a::b::c`: an
    // import of `a::b::c` (what a re-export names is the child's).
    let resolve = |path: &[String]| -> Option<String> {
        let m = longest_module(&mods, path)?;
        let depth = m.split("::").count();
        let Some(item) = path.get(depth) else {
            return Some(m);
        };
        if defined.get(&m).is_some_and(|d| d.contains(item)) {
            return Some(m);
        }
        let owners: Vec<&String> = defined
            .iter()
            .filter(|(c, d)| {
                c.strip_prefix(m.as_str())
                    .and_then(|r| r.strip_prefix("::"))
                    .is_some_and(|r| !r.contains("::"))
                    && d.contains(item)
            })
            .map(|(c, _)| c)
            .collect();
        match owners.as_slice() {
            [one] => Some((*one).clone()),
            _ => Some(m),
        }
    };
    let mut out = Graph::new();
    for (m, (text, _)) in &texts {
        let deps = out.entry(m.clone()).or_default();
        let parent: Vec<String> = {
            let mut p: Vec<String> = m.split("::").map(str::to_string).collect();
            p.pop();
            p
        };
        let own: Vec<String> = m.split("::").map(str::to_string).collect();
        // An inline test module's `super::` is this module itself.
        let body_end = text.find("#[cfg(test)]\nmod tests").unwrap_or(text.len());
        let mut add = |d: String| {
            if &d != m && d != "error" && !d.starts_with("error::") {
                deps.insert(d);
            }
        };
        for (i, _) in text.match_indices("crate::") {
            if !starts_path(text, i) {
                continue;
            }
            for path in paths_after(text, i + 7) {
                if let Some(d) = resolve(&path) {
                    add(d);
                }
            }
        }
        for (i, _) in text[..body_end].match_indices("super::") {
            if !starts_path(text, i) {
                continue;
            }
            for mut rest in paths_after(text, i + 7) {
                let mut p = parent.clone();
                while rest.first().is_some_and(|s| s == "super") {
                    rest.remove(0);
                    p.pop();
                }
                p.extend(rest);
                if let Some(d) = resolve(&p) {
                    add(d);
                }
            }
        }
        // A child module named from here (`child::X`, `self::child::X`).
        for c in mods.iter().filter(|c| {
            c.strip_prefix(m.as_str())
                .and_then(|r| r.strip_prefix("::"))
                .is_some_and(|r| !r.contains("::"))
        }) {
            let name = c.rsplit("::").next().unwrap();
            let pat = format!("{name}::");
            let named = text[..body_end]
                .match_indices(&pat)
                .any(|(i, _)| starts_path(text, i) || text[..i].ends_with("self::"));
            if named {
                let mut p = own.clone();
                p.push(name.to_string());
                add(p.join("::"));
            }
        }
        if text.contains("fuser::") && m != "fuse" {
            deps.insert("fuser".into());
        }
    }
    out
}

/// The graph with every module folded into its top-level module.
fn top_level(g: &Graph) -> Graph {
    let top = |m: &str| m.split("::").next().unwrap().to_string();
    let mut out = Graph::new();
    for (a, ds) in g {
        let e = out.entry(top(a)).or_default();
        for d in ds {
            if top(d) != top(a) {
                e.insert(top(d));
            }
        }
    }
    out
}

/// Edges `a -> b` that lie on a cycle of `g`.
fn cycles(g: &Graph) -> Vec<String> {
    fn reaches(g: &Graph, from: &str, to: &str, seen: &mut BTreeSet<String>) -> bool {
        if from == to {
            return true;
        }
        if !seen.insert(from.to_string()) {
            return false;
        }
        g.get(from)
            .is_some_and(|ds| ds.iter().any(|d| reaches(g, d, to, seen)))
    }
    let mut out = Vec::new();
    for (a, ds) in g {
        for b in ds {
            if reaches(g, b, a, &mut BTreeSet::new()) {
                out.push(format!("{a} -> {b}"));
            }
        }
    }
    out
}

#[test]
fn no_import_cycles() {
    let g = modules();
    let top = cycles(&top_level(&g));
    assert!(top.is_empty(), "import cycles: {top:?}");
    // The tree of an edge `a::x -> a::y`: `a`.
    let tree = |e: &str| {
        let from = e.split(" -> ").next().unwrap();
        from.split("::").next().unwrap().to_string()
    };
    let inner = cycles(&g);
    let trees: BTreeSet<String> = inner.iter().map(|e| tree(e)).collect();
    let unexpected: Vec<_> = inner
        .iter()
        .filter(|e| !CHILD_CYCLES_LEFT.contains(&tree(e).as_str()))
        .collect();
    assert!(
        unexpected.is_empty(),
        "import cycles among a module's children: {unexpected:?}"
    );
    for t in CHILD_CYCLES_LEFT {
        assert!(
            trees.contains(*t),
            "{t} has no cycles among its children any more: remove it from CHILD_CYCLES_LEFT"
        );
    }
}

#[test]
fn the_core_keeps_its_layer_order() {
    let g = modules();
    let rank = |m: &str| FS_LAYERS.iter().position(|row| row.contains(&m));
    let mut wrong = Vec::new();
    for (m, ds) in g.iter().filter(|(m, _)| m.starts_with("fs")) {
        let Some(r) = rank(m) else {
            wrong.push(format!("{m} has no row in FS_LAYERS"));
            continue;
        };
        for d in ds.iter().filter(|d| d.starts_with("fs::")) {
            if rank(d).is_none_or(|rd| rd <= r) {
                wrong.push(format!("{m} -> {d}"));
            }
        }
    }
    assert!(wrong.is_empty(), "against the layer order: {wrong:?}");
    // Only the adapter uses the core; the name rules and the dataset engine below it
    // know neither.
    let top = top_level(&g);
    let users: Vec<_> = top
        .iter()
        .filter(|(m, ds)| ds.contains("fs") && m.as_str() != "fuse")
        .map(|(m, _)| m.clone())
        .collect();
    assert!(
        users.is_empty(),
        "modules other than fuse.rs use fs: {users:?}"
    );
}

#[test]
fn only_the_adapter_knows_fuser() {
    let m = modules();
    let users: Vec<_> = m
        .iter()
        .filter(|(_, d)| d.contains("fuser"))
        .map(|(k, _)| k.clone())
        .collect();
    assert!(
        users.is_empty(),
        "modules other than fuse.rs use fuser: {users:?}"
    );
}

/// A file a newcomer can read in one sitting: none in src/ over 1 000 lines (split by
/// concern, as gpu/stage.rs and pending/target.rs were).
#[test]
fn no_source_file_over_a_thousand_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rs_files(&root, &mut files);
    let long: Vec<_> = files
        .iter()
        .map(|f| (f, std::fs::read_to_string(f).unwrap().lines().count()))
        .filter(|(_, n)| *n > 1000)
        .map(|(f, n)| format!("{} ({n} lines)", f.display()))
        .collect();
    assert!(long.is_empty(), "split these by concern: {long:?}");
}

/// An errno is chosen in one place: the errno tables of the domain error enums in
/// src/error.rs (`NamespaceError`, `PendingError`, `ModelError`, `GpuError`). Elsewhere
/// code names the cause and the table gives the errno, so one cause never gets two.
#[test]
fn errnos_come_from_the_error_tables() {
    let mut files = Vec::new();
    rs_files(Path::new("src"), &mut files);
    let mut found = Vec::new();
    for f in files {
        if f.ends_with("error.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap();
        for (n, line) in text.lines().enumerate() {
            if line.contains("Error::new(libc::") {
                found.push(format!("{}:{}: {}", f.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "errnos picked outside src/error.rs (add a variant to a domain error enum):\n{}",
        found.join("\n")
    );
}
