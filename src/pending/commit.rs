//! Commit: every pending dataset of a file into one HDF5 file of virtual datasets, in
//! the phases it times, as one transition of the file.

use super::base::io;
use super::layout::{encode, Layout, PendingFile};
use super::nodes::{Nodes, PendingNode};
use super::ranges::{incomplete, Ranges};
use super::state::{transition, Transition};
use super::status::Status;
use super::tiles::{TileTarget, Tiles};
use crate::durable::{fsync_dir, unique, write_atomic};
use crate::error::{Error, PendingError, Result};
use crate::geometry::{tile_name, TileGrid};
use crate::writer::{self, VdsSpec, VdsTile};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Threads that fsync tile sources at commit: each fsync waits on the device (or, on a
/// distributed file system, on a server round trip), not on a CPU.
const FSYNC_THREADS: usize = 16;

/// In a file's staging area while a chunked commit's file is renamed into place and
/// its pending state not yet retired.
const RENAMED: &str = "renamed";

/// How long a commit waits for this daemon's background work on closed tiles (syncs,
/// encodings) before doing what is left itself.
const BACKGROUND_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// fdatasyncs files in parallel (commit time grows with tiles, so spread the syscalls),
/// through the descriptor this daemon holds where it has one (no open/close round
/// trips), then each parent directory once.
pub(super) fn fsync_all(files: &[(PathBuf, Option<Arc<TileTarget>>)]) -> Result<()> {
    let threads = FSYNC_THREADS.min(files.len().max(1));
    let chunk = files.len().div_ceil(threads).max(1);
    std::thread::scope(|s| {
        let hs: Vec<_> = files
            .chunks(chunk)
            .map(|part| {
                s.spawn(move || -> Result<()> {
                    for (p, open) in part {
                        match open {
                            Some(t) => t.file.file.sync_data(),
                            None => std::fs::File::open(p).and_then(|f| f.sync_data()),
                        }
                        .map_err(io(format!("fsync {}", p.display())))?;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in hs {
            h.join().map_err(|_| Error::io("fsync thread panicked"))??;
        }
        Ok::<(), Error>(())
    })?;
    let mut dirs: Vec<&Path> = files.iter().filter_map(|(p, _)| p.parent()).collect();
    dirs.dedup();
    for d in dirs {
        if let Ok(f) = std::fs::File::open(d) {
            let _ = f.sync_all();
        }
    }
    Ok(())
}

/// Names in a directory (one `readdir` pass instead of a stat per tile).
fn names_in(dir: &Path) -> std::collections::HashSet<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// `<tile>.h5 <offset>` lines of the per-tile offsets logs of older versions.
fn old_offsets(node: &Path) -> HashMap<String, u64> {
    let mut offsets = HashMap::new();
    if let Ok(rd) = std::fs::read_dir(node) {
        for e in rd.flatten() {
            if !e.file_name().to_string_lossy().starts_with("offsets.") {
                continue;
            }
            for line in std::fs::read_to_string(e.path())
                .unwrap_or_default()
                .lines()
            {
                if let Some((n, o)) = line.split_once(' ') {
                    if let Ok(o) = o.parse::<u64>() {
                        offsets.insert(n.to_string(), o);
                    }
                }
            }
        }
    }
    offsets
}

/// Gives a committed file the owner and mode of the file it replaces, or those of the
/// pending file's staging dir (its creator, the mode of its mkdir) for a new one; the
/// tile-source dir gets the same owner and the matching directory mode. The daemon
/// may run as root: without this every committed file would belong to root.
pub(super) fn set_owner(tmp: &Path, sources: &Path, target: &Path, stage: &Path) {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let (uid, gid, mode) = match (std::fs::metadata(target), std::fs::metadata(stage)) {
        (Ok(m), _) => (m.uid(), m.gid(), m.mode() & 0o7777),
        (_, Ok(m)) => (m.uid(), m.gid(), m.mode() & 0o666),
        _ => return,
    };
    let dir_mode = mode | ((mode & 0o444) >> 2);
    let _ = std::os::unix::fs::chown(tmp, Some(uid), Some(gid));
    let _ = std::fs::set_permissions(tmp, std::fs::Permissions::from_mode(mode));
    let _ = std::os::unix::fs::chown(sources, Some(uid), Some(gid));
    let _ = std::fs::set_permissions(sources, std::fs::Permissions::from_mode(dir_mode));
}

/// One dataset's sources dir, its pending node, and its sources' recorded `(data
/// offset, file length)`.
type Recorded = (
    PathBuf,
    PathBuf,
    super::rangelog::HashMap<String, (u64, u64)>,
);

/// A chunked dataset a commit publishes: its link in the file being built, its name,
/// attributes, and the tiles nobody wrote that the commit fills (`unwritten_tiles:
/// fill`).
struct ChunkedCommit {
    link: String,
    path: String,
    attrs: serde_json::Map<String, Value>,
    base: u64,
    chunk_bytes: u64,
    fill: Vec<u8>,
    fill_chunks: Vec<u64>,
    /// The file its tiles were written to: the file being built, or a compressed
    /// dataset's staging file.
    tiles: PathBuf,
    /// The file being built it is allocated in (the same for every chunked dataset of
    /// the commit).
    product: PathBuf,
    compressed: Option<super::store::Compressed>,
}

/// What a commit writes, found under the lock from the range logs.
struct CommitPlan {
    specs: Vec<VdsSpec>,
    /// Groups' attributes.
    extras: writer::Extras,
    /// Datasets that name their dimensions (their dimension scales are made last).
    named: Vec<writer::dims::Named>,
    chunked: Vec<ChunkedCommit>,
    groups: Vec<String>,
    /// Every tile source the new file maps.
    sources: Vec<PathBuf>,
    /// Sources some daemon wrote without syncing them since.
    to_sync: Vec<(PathBuf, Option<Arc<TileTarget>>)>,
    /// Per dataset: its sources dir, its pending node, and the sources' recorded
    /// `(data offset, file length)`.
    recorded: Vec<Recorded>,
    t_ranges: std::time::Duration,
}

/// The commit's reason for a dataset with missing tile bytes.
fn incomplete_problem(
    path: &str,
    miss: &[(String, Vec<(u64, u64)>)],
    m: &crate::staging::PendingMeta,
) -> String {
    let first: Vec<String> = miss
        .iter()
        .take(10)
        .map(|(t, r)| format!("{t} {r:?}"))
        .collect();
    format!(
        "{}: {} of {} tiles incomplete (first: {})",
        path,
        miss.len(),
        m.grid().num_tiles(),
        first.join(", ")
    )
}

/// Trash directories being deleted in the background, which a daemon about to exit
/// waits for (`wait_trash`): they hold the raw staging files of compressed datasets,
/// as large as the data, which only a later commit's sweep would find otherwise.
static TRASH_IN_FLIGHT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Waits up to `limit` for the background deletion of committed pending state.
pub fn wait_trash(limit: std::time::Duration) {
    let t0 = std::time::Instant::now();
    while TRASH_IN_FLIGHT.load(std::sync::atomic::Ordering::SeqCst) > 0 && t0.elapsed() < limit {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Age after which a trash directory is taken as left by a daemon that died.
const STALE_TRASH: std::time::Duration = std::time::Duration::from_secs(600);

/// The parts a commit reads and changes.
pub(super) struct Commit<'a> {
    pub(super) layout: &'a Layout,
    pub(super) nodes: &'a Nodes,
    pub(super) ranges: &'a Ranges,
    pub(super) tiles: &'a Tiles,
    pub(super) status: &'a Status,
}

impl Commit<'_> {
    /// Commits every pending dataset of a file into one HDF5 file of virtual datasets.
    /// Takes the file's lock in the backing directory, failing with EBUSY while another
    /// commit holds it: every change to a committed file runs under it, so changes made
    /// through several daemons at once are applied one after another. The result (or
    /// the error) is recorded for `.status`.
    pub(super) fn run(&self, file: &PendingFile) -> Result<Value> {
        let t0 = std::time::Instant::now();
        let urgent = self.tiles.hurry_encodings();
        self.ranges.wait_background(BACKGROUND_WAIT);
        drop(urgent);
        // (the writers' encodings still running or waiting to be placed)
        let t_background = t0.elapsed().as_secs_f64();
        let stage = self.layout.stage_dir(file);
        let result = transition(self.layout, file, Transition::Commit, |_| {
            self.locked(file, &stage)
        });
        // EBUSY: the running commit records its own result
        if result.as_ref().is_err_and(|e| e.errno == libc::EBUSY) {
            return result;
        }
        let v = match &result {
            Ok(v) => json!({"ok": true, "seconds": t0.elapsed().as_secs_f64(),
                "background_s": t_background, "result": v}),
            Err(e) => {
                json!({"ok": false, "error": e.to_string(), "seconds": t0.elapsed().as_secs_f64()})
            }
        };
        self.status.record(self.layout, file, v.clone());
        result.map(|_| v)
    }

    /// The commit, under the file's lock, in the phases it times: `plan` (the range
    /// logs and the checks), `write_index`, the fsync of tile bytes, `publish` (the new
    /// file renamed into place), then `retire` (the pending state moves to the trash).
    fn locked(&self, file: &PendingFile, stage: &Path) -> Result<Value> {
        let t0 = std::time::Instant::now();
        let nodes = Nodes::list(self.layout, file);
        let dir = self.layout.dir(file);
        let target = self.layout.target(file);
        if nodes.is_empty() && target.is_file() {
            return Ok(
                json!({"file": target, "datasets": [], "note": "nothing pending; file unchanged"}),
            );
        }
        let plan = self.plan(file, &nodes, &dir)?;
        let t_check = t0.elapsed();
        Self::write_index(&plan)?;
        let t_index = t0.elapsed();
        // Tile bytes must be durable before the file that points at them appears.
        fsync_all(&plan.to_sync)?;
        let t_fsync = t0.elapsed();
        // chunks of compressed datasets the commit encoded (not their writers)
        let mut encoded_here = 0;
        let mut chunked_steps = Value::Null;
        // staging files the committed file no longer needs (deleted with the trash)
        let mut discard = Vec::new();
        let t_vds = if plan.chunked.is_empty() {
            self.publish(file, stage, &dir, &target, &plan)?
        } else {
            let (t, n, steps) =
                self.publish_chunked(file, stage, &dir, &target, &plan, &mut discard)?;
            encoded_here = n;
            chunked_steps = steps;
            t
        };
        let t_published = t0.elapsed();
        self.retire(file, stage, &nodes, &discard)?;
        let _ = std::fs::remove_file(stage.join(RENAMED));
        let t_retired = t0.elapsed();
        let CommitPlan {
            specs,
            groups,
            sources,
            to_sync,
            t_ranges,
            ..
        } = plan;
        let synced_before = sources.len() - to_sync.len();
        let committed: std::collections::HashSet<PathBuf> = sources.into_iter().collect();
        self.tiles.close_committed(&committed);
        let phases = json!({
            "ranges_s": t_ranges.as_secs_f64(),
            "check_s": t_check.as_secs_f64(),
            "index_s": (t_index - t_check).as_secs_f64(),
            "fsync_s": (t_fsync - t_index).as_secs_f64(),
            "synced_before": synced_before,
            "vds_s": t_vds.as_secs_f64(),
            "encoded_by_commit": encoded_here,
            "chunked_steps": chunked_steps,
            "retire_s": (t_retired - t_published).as_secs_f64(),
            "total_s": t0.elapsed().as_secs_f64(),
        });
        tracing::info!(tiles = committed.len(), %phases, "commit phases");
        Ok(json!({
            "file": target,
            "datasets": specs.iter().map(|s| &s.path).collect::<Vec<_>>(),
            "groups": groups,
            "tiles": committed.len(),
            "phases": phases,
        }))
    }

    /// The datasets and groups to commit, from the range logs; refuses (ENODATA) when a
    /// dataset is incomplete or lost tile sources.
    fn plan(&self, file: &PendingFile, nodes: &[PendingNode], dir: &Path) -> Result<CommitPlan> {
        let mut specs = Vec::new();
        let mut groups = Vec::new();
        let mut problems = Vec::new();
        let mut sources = Vec::new();
        let mut to_sync = Vec::new();
        // per dataset: its sources dir and what the range logs say of its sources
        let mut recorded = Vec::new();
        let mut chunked = Vec::new();
        let mut t_ranges = std::time::Duration::ZERO;
        for n in nodes {
            // A refused meta.json: the user meant a dataset (or another description of
            // it) that this commit cannot make. Without this the node became an empty
            // group, or kept the description the user tried to replace.
            if let Some(why) = &n.refused {
                problems.push(format!(
                    "{}: its meta.json was refused ({}); write one that is accepted, or rmdir it",
                    n.path,
                    why.trim()
                ));
                continue;
            }
            let Some(m) = &n.meta else {
                groups.push(n.path.clone());
                continue;
            };
            let ds = self.layout.dataset(file, &n.path);
            let t = std::time::Instant::now();
            let written = self
                .ranges
                .collect(&ds, self.nodes.gen(&ds).ok().as_deref())?;
            t_ranges += t.elapsed();
            let (miss, unwritten) = incomplete(&written.ranges, m, &super::ranges::torn(&ds.node));
            let gen = self.nodes.gen(&ds)?;
            if m.chunked {
                if !miss.is_empty() {
                    problems.push(incomplete_problem(&n.path, &miss, m));
                    continue;
                }
                let rec = super::chunked::record(&ds.node)
                    .filter(|r| r.gen == gen)
                    .ok_or_else(|| PendingError::Corrupt {
                        what: format!("{}: no chunk record of generation {gen}", n.path),
                    })?;
                let grid = m.grid();
                let fill_chunks = grid
                    .indices()
                    .enumerate()
                    .filter(|(_, idx)| unwritten.contains(&tile_name(idx)))
                    .map(|(k, _)| k as u64)
                    .collect();
                let fill = writer::fill_bytes(&m.dtype, &m.fill_value)
                    .unwrap_or_else(|| vec![0; m.itemsize as usize]);
                let tiles = rec.tiles_file(&self.layout.product(file));
                // tiles their writers encoded (pending/slots.rs), by chunk number
                let encoded: HashMap<u64, super::rangelog::Stored> = grid
                    .indices()
                    .enumerate()
                    .filter_map(|(k, idx)| {
                        Some((k as u64, *written.encoded.get(&tile_name(&idx))?))
                    })
                    .collect();
                let compressed = match (rec.slots.clone(), m.compression.clone()) {
                    (Some(slots), Some(compression)) => Some(super::store::Compressed {
                        slots,
                        compression,
                        itemsize: m.itemsize as usize,
                        chunks: grid.num_tiles(),
                        rank: m.shape.len(),
                        encoded,
                        // (records of earlier versions' logs, and the entries)
                        regions: written
                            .regions
                            .iter()
                            .copied()
                            .chain(super::regions::claimed(&super::regions::dir(
                                &ds.node, &gen,
                            )))
                            .collect::<std::collections::BTreeSet<_>>()
                            .into_iter()
                            .collect(),
                    }),
                    (None, None) => None,
                    _ => {
                        return Err(PendingError::Corrupt {
                            what: format!(
                                "{}: its chunk record and meta.json disagree on compression",
                                n.path
                            ),
                        }
                        .into())
                    }
                };
                chunked.push(ChunkedCommit {
                    tiles,
                    product: rec.product_path(&self.layout.product(file)),
                    compressed,
                    link: rec.link,
                    path: n.path.clone(),
                    attrs: m.attrs.clone(),
                    base: rec.base,
                    chunk_bytes: rec.chunk_bytes,
                    fill,
                    fill_chunks,
                });
                continue;
            }
            let rel_dir = format!("{}/{}/{gen}", file.sources_rel(), encode(&n.path));
            let src_dir = dir.join(&rel_dir);
            let present = names_in(&src_dir);
            let grid: TileGrid = m.grid();
            let mut tiles = Vec::new();
            let mut lost = Vec::new();
            for idx in grid.indices() {
                let slab = grid.tile_slab(&idx).ok_or_else(|| PendingError::Corrupt {
                    what: format!("{} tile geometry", n.path),
                })?;
                let tname = tile_name(&idx);
                if unwritten.contains(&tname) {
                    continue;
                }
                let file_name = format!("{tname}.h5");
                let src = src_dir.join(&file_name);
                // a name another client made may be missing from this listing for a
                // moment (GlusterFS): looked up itself before it counts as lost. A tile
                // of an incomplete dataset that nobody wrote yet has no source to lose.
                let expected = miss.is_empty() || written.ranges.contains_key(&tname);
                if expected
                    && !present.contains(&file_name)
                    && crate::durable::retry_missing(|| std::fs::metadata(&src)).is_err()
                {
                    lost.push(tname.clone());
                }
                // durable already when every daemon that wrote it synced it since
                if written.unsynced.contains(&tname) {
                    let open = self.tiles.open(&src);
                    to_sync.push((src.clone(), open));
                }
                sources.push(src);
                tiles.push(VdsTile {
                    start: slab.dims.iter().map(|d| d.start).collect(),
                    count: slab.counts(),
                    source: format!("{rel_dir}/{file_name}"),
                });
            }
            // Deleted sources first: the writes refused after the deletion (ESTALE)
            // also leave their tiles incomplete, and "incomplete" alone hid the cause.
            if !lost.is_empty() {
                problems.push(format!(
                    "{}: tile sources deleted outside h5tilefs: {} (rmdir the dataset and write it again)",
                    n.path,
                    lost.iter().take(10).cloned().collect::<Vec<_>>().join(", ")
                ));
                continue;
            }
            if !miss.is_empty() {
                problems.push(incomplete_problem(&n.path, &miss, m));
                continue;
            }
            recorded.push((src_dir, ds.node, written.sources));
            specs.push(VdsSpec {
                path: n.path.clone(),
                dtype: m.dtype.clone(),
                shape: m.shape.clone(),
                tiles,
                fill_value: m.fill_value.clone(),
                attrs: m.attrs.clone(),
            });
        }
        if !problems.is_empty() {
            // Its own errno, so scripts tell "not finished" from a failure of the disk.
            return Err(PendingError::Incomplete {
                file: file.display().to_string(),
                problems: problems.join("; "),
            }
            .into());
        }
        let extras = writer::Extras {
            group_attrs: super::groups::all(self.layout, file, groups.iter().map(String::as_str)),
        };
        let named = nodes
            .iter()
            .filter_map(|n| {
                let m = n.meta.as_ref()?;
                Some(writer::dims::Named {
                    path: n.path.clone(),
                    shape: m.shape.clone(),
                    dims: m.dims.clone()?,
                })
            })
            .collect();
        Ok(CommitPlan {
            specs,
            extras,
            named,
            chunked,
            groups,
            sources,
            to_sync,
            recorded,
            t_ranges,
        })
    }

    fn write_index(plan: &CommitPlan) -> Result<()> {
        // An index of data offsets next to each dataset's sources lets readers (ours)
        // serve the committed file without opening every source through HDF5. Offsets
        // and lengths come from the range logs (recorded by each source's creator); a
        // source made by an older version is looked up in its offsets log and stat'ed.
        for (spec, (src_dir, node, recorded)) in plan.specs.iter().zip(&plan.recorded) {
            let mut old: Option<HashMap<String, u64>> = None;
            let mut text = String::new();
            for t in &spec.tiles {
                let name = t.source.rsplit('/').next().unwrap_or_default();
                let tile = name.strip_suffix(".h5").unwrap_or(name);
                if let Some((o, len)) = recorded.get(tile) {
                    text.push_str(&crate::ondisk::source_index_line(name, *o, *len));
                    continue;
                }
                let old = old.get_or_insert_with(|| old_offsets(node));
                let len = std::fs::metadata(src_dir.join(name)).map(|m| m.len());
                if let (Some(o), Ok(len)) = (old.get(name), len) {
                    text.push_str(&crate::ondisk::source_index_line(name, *o, len));
                }
            }
            let idx = src_dir.join(crate::ondisk::SOURCE_INDEX);
            write_atomic(&idx, text.as_bytes())?;
        }
        Ok(())
    }

    /// Writes the new file beside the target and renames it into place (then fsyncs
    /// the directory); returns how long that took.
    fn publish(
        &self,
        file: &PendingFile,
        stage: &Path,
        dir: &Path,
        target: &Path,
        plan: &CommitPlan,
    ) -> Result<std::time::Duration> {
        let t = std::time::Instant::now();
        let tmp = stage.join(format!(
            "commit.{}.{}.tmp.h5",
            self.ranges.writer_id,
            unique()
        ));
        let base = (target.is_file()).then_some(target);
        let written = writer::write_vds_file(&tmp, base, &plan.specs, &plan.groups, &plan.extras)
            .and_then(|()| writer::dims::attach(&tmp, &plan.named));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        set_owner(&tmp, &dir.join(file.sources_rel()), target, stage);
        let took = t.elapsed();
        if let Err(e) = std::fs::rename(&tmp, target) {
            let _ = std::fs::remove_file(&tmp);
            return Err(Error::from_io(
                format!("renaming into {}", target.display()),
                e,
            ));
        }
        fsync_dir(dir)?;
        // A chunked layout's file left by chunked datasets removed before this commit
        // (none is pending now) goes: the next one starts from the file just committed.
        super::chunked::remove_unused_products(self.layout, file);
        Ok(took)
    }

    /// The chunked layout's commit: the file being built becomes the committed file.
    /// Tiles nobody wrote (with `unwritten_tiles: fill`) get the fill value, the file's
    /// bytes are fsynced, the declared datasets get their names, the virtual datasets
    /// and groups of the same commit are added in place, and the file is renamed into
    /// place. No tile byte moves.
    fn publish_chunked(
        &self,
        file: &PendingFile,
        stage: &Path,
        dir: &Path,
        target: &Path,
        plan: &CommitPlan,
        discard: &mut Vec<PathBuf>,
    ) -> Result<(std::time::Duration, u64, Value)> {
        let t = std::time::Instant::now();
        // seconds since `t` at each step, for the commit's phases
        let mut steps = serde_json::Map::new();
        let mut mark = |name: &str| {
            steps.insert(name.to_string(), json!(t.elapsed().as_secs_f64()));
        };
        let product = plan
            .chunked
            .first()
            .map(|c| c.product.clone())
            .unwrap_or_else(|| self.layout.product(file));
        if plan.chunked.iter().any(|c| c.product != product) {
            return Err(Error::io(format!(
                "{}: its chunked datasets are allocated in different files being built \
                 (staging area damaged): remove them and declare them again",
                file.display()
            )));
        }
        let mut encoded_here = 0;
        let renamed = stage.join(RENAMED);
        if target.exists() && renamed.exists() && !product.exists() {
            // an earlier try renamed the file into place and died before retiring the
            // pending state: committed already
            tracing::info!(file = %target.display(), "chunked file renamed by an earlier commit; retiring its pending state");
            for c in plan.chunked.iter().filter(|c| c.compressed.is_some()) {
                let _ = std::fs::remove_file(&c.tiles);
            }
            return Ok((t.elapsed(), 0, Value::Null));
        }
        if !super::chunked::still_based_on(&product, target)? {
            return Err(Error::invalid(format!(
                "{}: the committed file changed outside h5tilefs since its chunked datasets \
                 were declared (made, replaced or removed), and committing would lose that \
                 change: remove the pending datasets (rmdir) and declare them again",
                file.display()
            )));
        }
        {
            use std::os::unix::fs::FileExt;
            for c in &plan.chunked {
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&c.tiles)
                    .map_err(io(format!("opening {}", c.tiles.display())))?;
                if !c.fill_chunks.is_empty() {
                    let n = usize::try_from(c.chunk_bytes / c.fill.len().max(1) as u64)
                        .map_err(|_| Error::io("chunk too large"))?;
                    let chunk = c.fill.repeat(n);
                    for k in &c.fill_chunks {
                        let at = k
                            .checked_mul(c.chunk_bytes)
                            .and_then(|o| o.checked_add(c.base))
                            .ok_or_else(|| Error::io("chunk offset overflows"))?;
                        f.write_all_at(&chunk, at)
                            .map_err(io(format!("filling a chunk of {}", c.path)))?;
                    }
                }
                if c.compressed
                    .as_ref()
                    .is_some_and(|z| !c.fill_chunks.is_empty() || z.reads_staging())
                {
                    // every node's tile bytes are on the staging file before they are
                    // read, and durable for a commit tried again after a crash (not when
                    // every chunk's writer encoded it: then none is read, and the raw
                    // tiles, never needed, are not written to disk at all). One chunk
                    // left to the commit makes it write back every raw tile its writers
                    // did not (docs/reliability.md).
                    f.sync_data()
                        .map_err(io(format!("fsync {}", c.tiles.display())))?;
                }
            }
            mark("staging_synced_s");
            for c in &plan.chunked {
                if let Some(z) = &c.compressed {
                    let (stored, here) = super::store::store(
                        &product,
                        &c.tiles,
                        &c.link,
                        c.chunk_bytes,
                        z,
                        &z.encoded,
                    )?;
                    tracing::debug!(dataset = %c.path, stored, encoded_by_commit = here, "compressed chunks stored");
                    encoded_here += here;
                }
            }
            mark("stored_s");
            // every node's tile bytes (the commit's fsync of the file) before the
            // names that make them visible
            std::fs::File::open(&product)
                .and_then(|f| f.sync_all())
                .map_err(io(format!("fsync {}", product.display())))?;
            mark("synced_s");
        }
        let moves: Vec<(String, String)> = plan
            .chunked
            .iter()
            .map(|c| (c.link.clone(), c.path.clone()))
            .collect();
        writer::chunked::publish_links(&product, &moves, super::chunked::HIDDEN)?;
        let attrs: Vec<(String, serde_json::Map<String, Value>)> = plan
            .chunked
            .iter()
            .map(|c| (c.path.clone(), c.attrs.clone()))
            .collect();
        writer::write_vds_into(&product, &plan.specs, &plan.groups, &attrs, &plan.extras)?;
        writer::dims::attach(&product, &plan.named)?;
        set_owner(&product, &dir.join(file.sources_rel()), target, stage);
        mark("linked_s");
        let took = t.elapsed();
        // says, until the pending state is retired, that the file was renamed into
        // place (a commit tried again after a crash in between then only retires)
        write_atomic(&renamed, b"")?;
        std::fs::rename(&product, target)
            .map_err(|e| Error::from_io(format!("renaming into {}", target.display()), e))?;
        fsync_dir(dir)?;
        mark("renamed_s");
        super::chunked::forget_base(&product);
        if std::env::var_os("H5TILEFS_FAULT_ABORT_AFTER_RENAME").is_some() {
            // test hook (docs/operations.md): the daemon dies between the rename and
            // the retirement of the pending state
            tracing::error!("H5TILEFS_FAULT_ABORT_AFTER_RENAME: aborting");
            std::process::abort();
        }
        self.tiles.close_under(&product);
        // (the open tiles' keys lie under the staging area's default name)
        self.tiles.close_under(&self.layout.product(file));
        for c in plan.chunked.iter().filter(|c| c.compressed.is_some()) {
            self.tiles.close_under(&c.tiles);
            // Unlinking a staging file of hundreds of MiB whose pages are still
            // dirty took 50 ms, most of a commit's own time: it goes with the trash,
            // in the background, after a rename that frees its name at once.
            discard.push(c.tiles.clone());
        }
        Ok((took, encoded_here, Value::Object(steps)))
    }

    /// After the rename: the committed nodes' pending state and older generations go.
    fn retire(
        &self,
        file: &PendingFile,
        stage: &Path,
        nodes: &[PendingNode],
        discard: &[PathBuf],
    ) -> Result<()> {
        // Committed. The pending state (range logs: one per daemon) and older
        // generations of replaced datasets go: renamed out of the way now, so a dataset
        // created again at once starts clean, and deleted in the background.
        // A trash directory of its own per commit: an earlier commit's may still be
        // being deleted in the background, and a rename onto one of its names fails.
        let trash = stage.join(format!(
            "trash.{}.{}",
            self.ranges.writer_id,
            crate::durable::unique()
        ));
        let _ = std::fs::create_dir_all(&trash);
        let mut k = 0;
        // What moves to the trash must be gone from where it was: a committed
        // dataset's node left behind would read as pending, and removing that
        // "pending" dataset would delete the sources the committed file maps.
        let mut to_trash = |p: &Path| {
            k += 1;
            match std::fs::rename(p, trash.join(format!("{k}"))) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(path = %p.display(), error = %e,
                        "moving committed pending state to the trash failed; deleting it in place");
                    let removed = if p.is_dir() {
                        std::fs::remove_dir_all(p)
                    } else {
                        std::fs::remove_file(p)
                    };
                    if let Err(e) = removed {
                        if e.kind() != std::io::ErrorKind::NotFound {
                            tracing::error!(path = %p.display(), error = %e,
                                "committed pending state could not be removed: remove it by hand");
                        }
                    }
                }
            }
        };
        for p in discard {
            to_trash(p);
        }
        for n in nodes {
            let ds = self.layout.dataset(file, &n.path);
            let gen = self.nodes.gen(&ds).ok();
            self.ranges.forget(&ds.node);
            self.nodes.forget(&ds);
            to_trash(&ds.node);
            if let Some(gen) = gen {
                let parent_src = self.layout.sources_parent(&ds);
                if let Ok(rd) = std::fs::read_dir(&parent_src) {
                    for e in rd.flatten() {
                        if e.file_name().to_string_lossy() != gen {
                            to_trash(&e.path());
                        }
                    }
                }
            }
        }
        to_trash(&stage.join("nodes").join(super::groups::ROOT_ATTRS));
        let _ = std::fs::remove_dir(stage.join("nodes"));
        let stage_dir = stage.to_path_buf();
        struct InFlight;
        impl Drop for InFlight {
            fn drop(&mut self) {
                TRASH_IN_FLIGHT.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
        TRASH_IN_FLIGHT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let in_flight = InFlight;
        std::thread::spawn(move || {
            let _in_flight = in_flight;
            let _ = std::fs::remove_dir_all(trash);
            // Trash a daemon left when it died mid-delete: old enough that no live
            // daemon is still deleting it.
            let Ok(rd) = std::fs::read_dir(&stage_dir) else {
                return;
            };
            for e in rd.flatten() {
                let old = e
                    .metadata()
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.elapsed().ok())
                    .is_some_and(|age| age > STALE_TRASH);
                if old && e.file_name().to_string_lossy().starts_with("trash.") {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        });
        Ok(())
    }
}
