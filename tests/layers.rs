//! The layers of src/ form no import cycle, and the core knows nothing of fuser: a
//! module's `crate::` references are its imports (docs/architecture.md lists the layers).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

fn modules() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut files = Vec::new();
    for e in std::fs::read_dir(&src).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            for f in std::fs::read_dir(&p).unwrap().flatten() {
                files.push(f.path());
            }
        } else {
            files.push(p);
        }
    }
    for f in files {
        if f.extension().and_then(|x| x.to_str()) != Some("rs") {
            continue;
        }
        let rel = f.strip_prefix(&src).unwrap();
        let top = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_string();
        // binaries are front ends, not layers of the core (src/bin holds the FUSE floor
        // of the read benchmark, a file system of its own)
        if top == "main" || top == "lib" || top == "bin" {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap();
        let deps = out.entry(top.clone()).or_default();
        for (i, _) in text.match_indices("crate::") {
            let name: String = text[i + 7..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if name != top && name != "error" && !name.is_empty() {
                deps.insert(name);
            }
        }
        if text.contains("fuser::") && top != "fuse" {
            deps.insert("fuser".into());
        }
    }
    out
}

#[test]
fn no_import_cycles() {
    let m = modules();
    fn reaches(
        m: &BTreeMap<String, BTreeSet<String>>,
        from: &str,
        to: &str,
        seen: &mut BTreeSet<String>,
    ) -> bool {
        if from == to {
            return true;
        }
        if !seen.insert(from.to_string()) {
            return false;
        }
        m.get(from)
            .is_some_and(|ds| ds.iter().any(|d| reaches(m, d, to, seen)))
    }
    let mut cycles = Vec::new();
    for (a, ds) in &m {
        for b in ds {
            if reaches(&m, b, a, &mut BTreeSet::new()) {
                cycles.push(format!("{a} -> {b}"));
            }
        }
    }
    assert!(cycles.is_empty(), "import cycles: {cycles:?}");
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
