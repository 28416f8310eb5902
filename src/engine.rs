//! The dataset engine's state, in one value: the read-ahead knobs (parsed once,
//! from the environment for measurements), the memory budget of view blocks shared by
//! every open handle, the threads that read those blocks, and the cache of tile-source
//! indexes. Before this, each lived in a `static` of its own module.
//!
//! Each mount owns one (`Mount::engine`), built from `FsOptions::engine`: the daemon
//! takes the environment's overrides, in-process tests the defaults, so several cores
//! in one process (standing for several daemons) share none of it.

use crate::decode::{Job, WorkerPool};
use crate::ondisk::SourceIndexCache;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};

/// How far ahead of a sequential reader bytes are fetched: enough that with chunks
/// whose rows span many requests (an 8192 × 8192 `<f4` in 512 × 512 chunks has 16 MiB
/// per row of chunks) the next row is decoding while this one is copied.
pub const WINDOW: u64 = 32 << 20;

/// Bytes per view block read ahead of a sequential reader, and how many blocks ahead.
/// Why blocks of the view, read into memory: the kernel keeps one 4 MiB window of a
/// FUSE file in flight; reading the next 8 MiB blocks ahead of it raised cold reads of
/// a 512 MiB `data` from 0.88× to 0.92× of a direct read (medians of seven A/B pairs)
/// and unfiltered square chunks by 11–31 % (H100 machine,
/// docs/perf-log/2026-11-26-thinnest-fuse-daemon.md). Blocks aligned in the backing file
/// instead were slower: a request that crossed into the next block waited for all of it.
pub const VIEW_BLOCK: u64 = 8 << 20;
pub const VIEW_DEPTH: u64 = 2;
/// Most bytes held in view blocks over every handle; past it, no block is read ahead.
pub const VIEW_BUDGET: u64 = 128 << 20;

/// Sequential bytes a handle reads before its first block is read ahead: one block,
/// so that a file's first window is not queued behind blocks at the disk (a single
/// `numpy.fromfile` of a tile on GlusterFS read at 0.78–0.80× with blocks from the
/// first request).
pub const VIEW_START: u64 = 8 << 20;

/// Threads that read view blocks. Not the decode pool: a block's read may decode cells
/// on that pool and wait for them (a virtual dataset whose sources turn out compressed),
/// and a pool thread waiting on jobs queued behind it would wait forever.
const VIEW_THREADS: usize = 4;

/// The engine's knobs. [`Default`] is the compiled-in values; [`Self::from_env`]
/// applies the measurement overrides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineConfig {
    /// Read-ahead window of cells and file pages (`H5TILEFS_READAHEAD_MIB`; 0 turns the
    /// daemon's read-ahead off, the kernel's own stays).
    pub window: u64,
    /// Sequential bytes before view blocks are read ahead (`H5TILEFS_VIEW_AHEAD_START_MIB`).
    pub view_start: u64,
    /// View block size and depth (`H5TILEFS_VIEW_AHEAD=BLOCK_MIB:DEPTH`, `0:0` off).
    pub view_block: u64,
    pub view_depth: u64,
    /// Bytes of view blocks over every handle.
    pub view_budget: u64,
    /// Also `WILLNEED` the backing file runs ahead (`H5TILEFS_READAHEAD_FILES=1`).
    pub files_too: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            window: WINDOW,
            view_start: VIEW_START,
            view_block: VIEW_BLOCK,
            view_depth: VIEW_DEPTH,
            view_budget: VIEW_BUDGET,
            files_too: false,
        }
    }
}

impl EngineConfig {
    /// The defaults with the `H5TILEFS_*` measurement overrides of this process.
    pub fn from_env() -> Self {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// The defaults with overrides looked up by `get` (unset or unparsable: default).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Self {
        let d = Self::default();
        let mib = |var: &str, default: u64| {
            get(var)
                .and_then(|v| v.parse::<u64>().ok())
                .map_or(default, |m| m.saturating_mul(1 << 20))
        };
        let (view_block, view_depth) = get("H5TILEFS_VIEW_AHEAD")
            .and_then(|v| {
                let (b, d) = v.split_once(':')?;
                Some((
                    b.parse::<u64>().ok()?.saturating_mul(1 << 20),
                    d.parse::<u64>().ok()?,
                ))
            })
            .map(|(b, d)| if b == 0 { (0, 0) } else { (b, d) })
            .unwrap_or((d.view_block, d.view_depth));
        EngineConfig {
            window: mib("H5TILEFS_READAHEAD_MIB", d.window),
            view_start: mib("H5TILEFS_VIEW_AHEAD_START_MIB", d.view_start),
            view_block,
            view_depth,
            view_budget: d.view_budget,
            files_too: get("H5TILEFS_READAHEAD_FILES").is_some_and(|v| v == "1"),
        }
    }

    /// `(block, depth)` of view read-ahead; block 0 is off.
    pub fn view_ahead(&self) -> (u64, u64) {
        (self.view_block, self.view_depth)
    }
}

/// The engine: its configuration and the state every handle of a mount shares.
pub struct Engine {
    pub config: EngineConfig,
    /// Bytes held in view blocks over every handle (`readahead::Slot`s give theirs back
    /// when dropped).
    pub view_held: Arc<AtomicU64>,
    /// Threads reading view blocks, started on first use.
    view_pool: OnceLock<WorkerPool>,
    /// Parsed tile-source indexes, per directory of tile sources.
    pub sources: Arc<SourceIndexCache>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("config", &self.config)
            .finish()
    }
}

impl Engine {
    pub fn new(config: EngineConfig) -> Engine {
        Engine {
            config,
            view_held: Arc::default(),
            view_pool: OnceLock::new(),
            sources: Arc::default(),
        }
    }

    /// Runs `job` on the view-block threads (or here, if none could be started). A job
    /// that panics is caught (its slot fails through `readahead::SlotGuard`); the thread
    /// stays for the next one.
    pub fn view_background(&self, job: Job) {
        let pool = self
            .view_pool
            .get_or_init(|| WorkerPool::new("view", VIEW_THREADS));
        let job: Job = Box::new(move || {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
        });
        if let Err(job) = pool.submit(job) {
            job();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_overrides_parse_once_and_fall_back_to_defaults() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(EngineConfig::from_vars(|_| None), EngineConfig::default());
        let c = EngineConfig::from_vars(vars(&[
            ("H5TILEFS_READAHEAD_MIB", "0"),
            ("H5TILEFS_VIEW_AHEAD_START_MIB", "3"),
            ("H5TILEFS_VIEW_AHEAD", "16:4"),
            ("H5TILEFS_READAHEAD_FILES", "1"),
        ]));
        assert_eq!(c.window, 0);
        assert_eq!(c.view_start, 3 << 20);
        assert_eq!(c.view_ahead(), (16 << 20, 4));
        assert!(c.files_too);
        let c = EngineConfig::from_vars(vars(&[
            ("H5TILEFS_READAHEAD_MIB", "lots"),
            ("H5TILEFS_VIEW_AHEAD", "0:7"),
            ("H5TILEFS_READAHEAD_FILES", "yes"),
        ]));
        assert_eq!(c.window, WINDOW);
        assert_eq!(c.view_ahead(), (0, 0));
        assert!(!c.files_too);
        assert_eq!(
            EngineConfig::from_vars(vars(&[("H5TILEFS_VIEW_AHEAD", "8")])).view_ahead(),
            (VIEW_BLOCK, VIEW_DEPTH)
        );
    }
}
