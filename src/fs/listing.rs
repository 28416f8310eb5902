//! Listings held for readers of a directory: the one taken at `opendir`, paged by
//! `readdir` offsets so a directory of n entries costs O(n) however many calls page
//! through it, and those of directories read without `opendir`.

use super::attr::DirEntry;
use crate::error::Result;
use dashmap::DashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
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
    /// Listings of directories read without `opendir` (the kernel's no-opendir mode:
    /// readdir comes with handle 0): one per directory inode, taken at offset 0 and
    /// dropped when a reader reaches the end; cleared whole past `MAX_INO_LISTINGS`
    /// (listings abandoned half-read).
    ino_dirs: DashMap<u64, Arc<Vec<DirEntry>>>,
    /// Entries held in `ino_dirs` (approximately: a clear races with inserts).
    ino_entries: AtomicUsize,
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
            // not opened through `opendir`: the listing of the directory inode
            return self.ino_listing(ino, offset, list);
        };
        if offset == 0 && snap.served.swap(true, Ordering::Relaxed) {
            let fresh = Arc::new(list()?);
            *snap.entries.lock() = fresh.clone();
            return Ok(fresh);
        }
        let e = snap.entries.lock().clone();
        Ok(e)
    }

    /// See `ino_dirs`. Two readers listing one directory at once share its listing, or
    /// one restarts it: each still sees every entry the directory had at some offset-0
    /// read, which is what readdir promises while a directory changes.
    fn ino_listing(
        &self,
        ino: u64,
        offset: u64,
        list: &dyn Fn() -> Result<Vec<DirEntry>>,
    ) -> Result<Arc<Vec<DirEntry>>> {
        // Bounds on what abandoned listings can hold: listings and entries in total
        // (about 100 MB of entries at most, plus the one listing being read).
        const MAX_INO_LISTINGS: usize = 1024;
        const MAX_INO_ENTRIES: usize = 1 << 20;
        let sub = |n: usize| {
            let _ = self
                .ino_entries
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                    Some(v.saturating_sub(n))
                });
        };
        if offset == 0 {
            let fresh = Arc::new(list()?);
            let n = fresh.len();
            if self.ino_dirs.len() >= MAX_INO_LISTINGS
                || self.ino_entries.load(Ordering::Relaxed).saturating_add(n) > MAX_INO_ENTRIES
            {
                self.ino_dirs.clear();
                self.ino_entries.store(0, Ordering::Relaxed);
            }
            if let Some(old) = self.ino_dirs.insert(ino, fresh.clone()) {
                sub(old.len());
            }
            self.ino_entries.fetch_add(n, Ordering::Relaxed);
            return Ok(fresh);
        }
        let snap = self.ino_dirs.get(&ino).map(|d| d.clone());
        match snap {
            Some(s) => {
                // offsets count `.` and `..`: past the last entry, the reader is done
                if offset >= s.len() as u64 + 2 {
                    if let Some((_, old)) = self.ino_dirs.remove(&ino) {
                        sub(old.len());
                    }
                }
                Ok(s)
            }
            None => Ok(Arc::new(list()?)),
        }
    }

    /// Listings held for readers in no-opendir mode, and their entries (for tests and
    /// the bounds of `ino_listing`).
    pub fn held(&self) -> (usize, usize) {
        (
            self.ino_dirs.len(),
            self.ino_entries.load(Ordering::Relaxed),
        )
    }

    pub fn release(&self, fh: u64) {
        self.dirs.remove(&fh);
    }
}
