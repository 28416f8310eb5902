//! Listings held for readers of a directory: the one taken at `opendir`, paged by
//! `readdir` offsets so a directory of n entries costs O(n) however many calls page
//! through it. The kernel is given no listing to cache (src/fuse.rs `opendir`).

use super::attr::DirEntry;
use crate::error::Result;
use dashmap::DashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A directory listing held by an open directory handle.
struct DirSnapshot {
    ino: u64,
    entries: parking_lot::Mutex<Arc<Vec<DirEntry>>>,
    /// Set once a read at offset 0 was answered from `entries`.
    served: std::sync::atomic::AtomicBool,
}

/// The listings of one mount.
#[derive(Default)]
pub struct Listings {
    /// Open directories: the listing taken at `opendir`.
    dirs: DashMap<u64, Arc<DirSnapshot>>,
}

impl Listings {
    /// Holds listing `entries` of directory `ino` for open directory handle `fh`.
    pub fn open(&self, fh: u64, ino: u64, entries: Vec<DirEntry>) {
        let snap = DirSnapshot {
            ino,
            entries: parking_lot::Mutex::new(Arc::new(entries)),
            served: std::sync::atomic::AtomicBool::new(false),
        };
        self.dirs.insert(fh, Arc::new(snap));
    }

    /// The listing of open directory `fh` for a read at `offset`: the one taken at
    /// `opendir`, or a new one when a reader that has read it starts over (rewinddir).
    pub fn read_at(
        &self,
        fh: u64,
        ino: u64,
        offset: u64,
        list: &dyn Fn() -> Result<Vec<DirEntry>>,
    ) -> Result<Arc<Vec<DirEntry>>> {
        let snap = self.dirs.get(&fh).map(|d| d.clone());
        let Some(snap) = snap.filter(|d| d.ino == ino) else {
            // not opened through `opendir` (the kernel always opens directories): a
            // listing taken now
            return Ok(Arc::new(list()?));
        };
        if offset == 0 && snap.served.swap(true, Ordering::Relaxed) {
            let fresh = Arc::new(list()?);
            *snap.entries.lock() = fresh.clone();
            return Ok(fresh);
        }
        let e = snap.entries.lock().clone();
        Ok(e)
    }

    /// Listings held for open directories (for tests: each is released with its handle).
    pub fn held(&self) -> usize {
        self.dirs.len()
    }

    pub fn release(&self, fh: u64) {
        self.dirs.remove(&fh);
    }
}
