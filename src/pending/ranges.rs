use super::*;

impl Pending {
    pub(super) fn log_range(
        &self,
        file_rel: &Path,
        h5path: &str,
        idx: &[u64],
        off: u64,
        len: u64,
    ) -> Result<()> {
        // Opened per write: tiles can number in the tens of thousands, more than the fds
        // a daemon should hold; one open+append+close is small next to a tile write.
        let d = self.node_dir(file_rel, h5path)?.join("ranges");
        let p = d.join(format!("{}.{}", tile_name(idx), self.writer_id));
        let open = || {
            std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .open(&p)
        };
        let mut f = match open() {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                crate::durable::create_dir_all(&d)?;
                crate::durable::retry_missing(open).map_err(io("opening range log"))?
            }
            Err(e) => return Err(Error::from_io("opening range log", e)),
        };
        f.write_all(&RangeSet::log_record(off, len))
            .map_err(io("appending range log"))
    }

    /// Written ranges of every tile of a pending dataset (all writers).
    pub fn written(&self, file_rel: &Path, h5path: &str) -> Result<HashMap<String, RangeSet>> {
        let d = self.node_dir(file_rel, h5path)?.join("ranges");
        let mut out: HashMap<String, RangeSet> = HashMap::new();
        let Ok(rd) = std::fs::read_dir(&d) else {
            return Ok(out);
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            // "<tile>.<host>.<pid>.<nanos>": the tile name is everything before the
            // first component that is not a number.
            let tile: Vec<&str> = name
                .split('.')
                .take_while(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
                .collect();
            let Ok(bytes) = std::fs::read(e.path()) else {
                continue;
            };
            let rs = RangeSet::from_log(&bytes);
            let entry = out.entry(tile.join(".")).or_default();
            for (a, b) in rs.ranges() {
                entry.insert(*a, *b);
            }
        }
        Ok(out)
    }

    /// Tiles (and byte ranges) not yet written, per pending dataset.
    pub fn missing(
        &self,
        file_rel: &Path,
        h5path: &str,
        meta: &PendingMeta,
    ) -> Result<Vec<MissingTile>> {
        let written = self.written(file_rel, h5path)?;
        let mut out = Vec::new();
        for idx in meta.grid().indices() {
            let name = tile_name(&idx);
            let size = meta.tile_bytes(&idx).unwrap_or(0);
            let miss = written
                .get(&name)
                .map(|r| r.missing(size))
                .unwrap_or_else(|| if size > 0 { vec![(0, size)] } else { vec![] });
            if !miss.is_empty() {
                out.push((name, miss));
            }
        }
        Ok(out)
    }
}
