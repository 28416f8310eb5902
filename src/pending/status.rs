use super::*;

impl Pending {
    /// `.status` of a file: pending datasets, tile completeness, last commit.
    pub fn status(&self, file_rel: &Path) -> Result<Value> {
        let mut ds = serde_json::Map::new();
        let mut groups = Vec::new();
        for n in self.nodes(file_rel)? {
            match &n.meta {
                Some(m) => {
                    let written = self.written(file_rel, &n.path)?;
                    let (miss, unwritten) = ranges::incomplete(&written, m);
                    let total = m.grid().num_tiles();
                    let shown: Vec<Value> = miss
                        .iter()
                        .take(100)
                        .map(|(t, r)| json!({"tile": t, "missing": r}))
                        .collect();
                    ds.insert(
                        n.path.clone(),
                        json!({
                            "tiles": total,
                            "complete": total - (miss.len() + unwritten.len()) as u64,
                            "missing": miss.len(),
                            // tiles nobody wrote, read as the fill value after the
                            // commit (`unwritten_tiles: fill`; 0 otherwise)
                            "unwritten": unwritten.len(),
                            "missing_detail": shown,
                        }),
                    );
                }
                None => groups.push(n.path.clone()),
            }
        }
        let last = match self.unsaved_status.get(file_rel) {
            Some(v) => v.clone(),
            None => std::fs::read(self.stage_dir(file_rel)?.join("status.json"))
                .ok()
                .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
                .unwrap_or(Value::Null),
        };
        Ok(json!({
            "pending": self.is_pending(file_rel),
            "datasets": ds,
            "groups": groups,
            "last_commit": last,
        }))
    }

    /// Records a problem (bad meta.json, failed commit) for `.status`.
    pub fn record_status(&self, file_rel: &Path, v: Value) {
        let saved = self.stage_dir(file_rel).and_then(|d| {
            crate::durable::create_dir_all(&d)?;
            write_atomic(
                &d.join("status.json"),
                &serde_json::to_vec(&v).unwrap_or_default(),
            )
        });
        match saved {
            Ok(()) => {
                self.unsaved_status.remove(file_rel);
            }
            Err(e) => {
                // Kept in memory so that `.status` still says why (e.g. a full disk).
                tracing::warn!(file = %file_rel.display(), error = %e, "status not saved");
                let mut v = v;
                if let Value::Object(m) = &mut v {
                    m.insert("status_not_saved".into(), Value::String(e.to_string()));
                }
                self.unsaved_status.insert(file_rel.to_path_buf(), v);
            }
        }
    }
}
