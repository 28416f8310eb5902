//! What `.status` shows of a file: its pending datasets, their tiles' completeness,
//! and the last commit's result (kept in memory when it could not be saved).

use super::layout::{Layout, PendingFile};
use super::nodes::Nodes;
use super::ranges::{incomplete, Ranges};
use crate::durable::write_atomic;
use crate::error::Result;
use dashmap::DashMap;
use serde_json::{json, Value};
use std::path::PathBuf;

/// The last status of each file that could not be saved to `status.json` (backing
/// file system full or read-only); shown by `.status` until a later one is saved.
#[derive(Default)]
pub(super) struct Status {
    unsaved: DashMap<PathBuf, Value>,
    /// The last refused request of each file through this daemon (a write past a
    /// tile's end, into committed data, a refused meta.json, ...), with its reason:
    /// the client only gets an errno. In memory: a reason for the user at hand, not
    /// state of the file.
    errors: DashMap<PathBuf, Value>,
}

impl Status {
    /// `.status` of a file: pending datasets, tile completeness, last commit.
    pub(super) fn show(
        &self,
        layout: &Layout,
        nodes: &Nodes,
        ranges: &Ranges,
        file: &PendingFile,
    ) -> Result<Value> {
        let mut ds = serde_json::Map::new();
        let mut groups = Vec::new();
        let mut refused = serde_json::Map::new();
        for n in Nodes::list(layout, file) {
            if let Some(why) = &n.refused {
                refused.insert(n.path.clone(), Value::String(why.trim().to_string()));
            }
            match &n.meta {
                Some(m) => {
                    let d = layout.dataset(file, &n.path);
                    let all = ranges.collect(&d, nodes.gen(&d).ok().as_deref())?;
                    let written = all.ranges;
                    let (miss, unwritten) = incomplete(&written, m, &super::ranges::torn(&d.node));
                    let total = m.grid().num_tiles();
                    let shown: Vec<Value> = miss
                        .iter()
                        .take(100)
                        .map(|(t, r)| json!({"tile": t, "missing": r}))
                        .collect();
                    let mut v = json!({
                            "layout": if m.chunked { "chunked" } else { "virtual" },
                            "tiles": total,
                            "complete": total - (miss.len() + unwritten.len()) as u64,
                            "missing": miss.len(),
                            // tiles nobody wrote, read as the fill value after the
                            // commit (`unwritten_tiles: fill`; 0 otherwise)
                            "unwritten": unwritten.len(),
                            "missing_detail": shown,
                    });
                    if let (Some(c), Some(o)) = (&m.compression, v.as_object_mut()) {
                        // tiles their writers have encoded (the commit encodes the rest)
                        o.insert("compression".into(), c.to_json().0);
                        o.insert("encoded".into(), json!(all.encoded.len()));
                    }
                    ds.insert(n.path.clone(), v);
                }
                // a node whose meta.json was refused is not a group
                None if n.refused.is_some() => {}
                None => groups.push(n.path.clone()),
            }
        }
        let last = match self.unsaved.get(file.rel()) {
            Some(v) => v.clone(),
            None => std::fs::read(layout.stage_dir(file).join("status.json"))
                .ok()
                .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
                .unwrap_or(Value::Null),
        };
        Ok(json!({
            "pending": Nodes::is_pending(layout, file),
            "datasets": ds,
            "groups": groups,
            // nodes whose last meta.json was refused, and why: the commit refuses
            "refused": refused,
            "last_commit": last,
            // the last request refused, kept apart from the last commit's result
            "last_error": self
                .errors
                .get(file.rel())
                .map(|v| v.clone())
                .unwrap_or(Value::Null),
        }))
    }

    /// Records a refused request of file `rel` for `.status`'s `last_error`.
    pub(super) fn note_error(&self, rel: &std::path::Path, v: Value) {
        // Bounded: a daemon serving many files keeps the reasons of the last 1 024.
        if self.errors.len() >= 1024 && !self.errors.contains_key(rel) {
            self.errors.clear();
        }
        self.errors.insert(rel.to_path_buf(), v);
    }

    /// Records a problem (bad meta.json, failed commit) for `.status`.
    pub(super) fn record(&self, layout: &Layout, file: &PendingFile, v: Value) {
        let d = layout.stage_dir(file);
        let saved = crate::durable::create_dir_all(&d).and_then(|()| {
            write_atomic(
                &d.join("status.json"),
                &serde_json::to_vec(&v).unwrap_or_default(),
            )
        });
        match saved {
            Ok(()) => {
                self.unsaved.remove(file.rel());
            }
            Err(e) => {
                // Kept in memory so that `.status` still says why (e.g. a full disk).
                tracing::warn!(file = %file.display(), error = %e, "status not saved");
                let mut v = v;
                if let Value::Object(m) = &mut v {
                    m.insert("status_not_saved".into(), Value::String(e.to_string()));
                }
                self.unsaved.insert(file.rel().to_path_buf(), v);
            }
        }
    }
}
