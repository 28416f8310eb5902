//! A cache of values built per backing file version (cuFile handles): keyed by (dev,
//! ino), revalidated against the full identity the value was built from, bounded, and
//! dropped with the file it serves.

use crate::h5file::Ident;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::{Arc, Weak};

/// One entry of an [`IdentCache`]: the identity the value was built from, the value (or
/// why it could not be built), the backing file it serves (the entry goes with it), and
/// when it was last used.
struct IdentEntry<H, O> {
    ident: Ident,
    value: std::result::Result<Arc<H>, String>,
    owner: Weak<O>,
    used: u64,
}

/// Values built per version of a backing inode: keyed by (dev, ino), revalidated against
/// the full identity (size, mtime, ctime) at every lookup, so a file rewritten in place
/// gets a new value and a replaced one (another inode) never shares an old one. Refusals
/// are remembered the same way. Bounded: least recently used entries, entries whose
/// backing file is gone, and entries of changed identities are dropped. Values are
/// `Arc`s handed out to users: dropping an entry never frees a value still in use. No
/// lock is held while a value is built or dropped (both may do I/O).
pub(super) struct IdentCache<H, O> {
    inner: Mutex<IdentMap<H, O>>,
    cap: usize,
}

/// The entries of an [`IdentCache`] by (dev, ino), and the clock of their last use.
struct IdentMap<H, O> {
    map: HashMap<(u64, u64), IdentEntry<H, O>>,
    tick: u64,
}

impl<H, O> IdentCache<H, O> {
    pub(super) fn new(cap: usize) -> Self {
        IdentCache {
            inner: Mutex::new(IdentMap {
                map: HashMap::new(),
                tick: 0,
            }),
            cap: cap.max(1),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.inner.lock().map.len()
    }

    /// Drops the entries whose backing file is gone (a file removed, a version
    /// replaced): their values go once their last user is done, rather than at some
    /// later lookup, which would pay for them.
    pub(super) fn sweep(&self) {
        let dropped: Vec<IdentEntry<H, O>> = {
            let mut g = self.inner.lock();
            let gone: Vec<_> = g
                .map
                .iter()
                .filter(|(_, e)| e.owner.strong_count() == 0)
                .map(|(k, _)| *k)
                .collect();
            gone.into_iter().filter_map(|k| g.map.remove(&k)).collect()
        };
        drop(dropped);
    }

    /// The value for this version of the inode, built with `make` on a miss or when the
    /// cached one was built from another version. A remembered refusal of the same
    /// version comes back as `Err` without calling `make`.
    pub(super) fn get(
        &self,
        ident: Ident,
        owner: &Arc<O>,
        make: impl FnOnce() -> std::result::Result<H, String>,
    ) -> std::result::Result<Arc<H>, String> {
        let key = (ident.dev, ident.ino);
        let mut dropped: Vec<IdentEntry<H, O>> = Vec::new();
        {
            let mut g = self.inner.lock();
            let IdentMap { map, tick } = &mut *g;
            *tick += 1;
            let now = *tick;
            if let Some(e) = map.get_mut(&key) {
                if e.ident == ident {
                    e.used = now;
                    if e.owner.strong_count() == 0 {
                        e.owner = Arc::downgrade(owner);
                    }
                    return e.value.clone();
                }
                if let Some(old) = map.remove(&key) {
                    dropped.push(old);
                }
            }
        }
        drop(dropped);
        let value = make().map(Arc::new);
        let mut dropped: Vec<IdentEntry<H, O>> = Vec::new();
        let out = {
            let mut g = self.inner.lock();
            let IdentMap { map, tick } = &mut *g;
            *tick += 1;
            let now = *tick;
            // Another thread may have built the same version meanwhile: keep one.
            let out = match map.get_mut(&key) {
                Some(e) if e.ident == ident => {
                    e.used = now;
                    e.value.clone()
                }
                _ => {
                    let e = IdentEntry {
                        ident,
                        value: value.clone(),
                        owner: Arc::downgrade(owner),
                        used: now,
                    };
                    if let Some(old) = map.insert(key, e) {
                        dropped.push(old);
                    }
                    value
                }
            };
            // Entries whose backing file is gone serve nobody; then the least recently
            // used ones beyond the cap.
            let gone: Vec<_> = map
                .iter()
                .filter(|(k, e)| **k != key && e.owner.strong_count() == 0)
                .map(|(k, _)| *k)
                .collect();
            for k in gone {
                dropped.extend(map.remove(&k));
            }
            while map.len() > self.cap {
                let Some(k) = map
                    .iter()
                    .filter(|(k, _)| **k != key)
                    .min_by_key(|(_, e)| e.used)
                    .map(|(k, _)| *k)
                else {
                    break;
                };
                dropped.extend(map.remove(&k));
            }
            out
        };
        drop(dropped);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

    /// A cached value that counts its drops (a cuFile handle deregisters in its Drop).
    struct Probe(Arc<AtomicUsize>);
    impl Drop for Probe {
        fn drop(&mut self) {
            self.0.fetch_add(1, SeqCst);
        }
    }

    fn ident(ino: u64, size: u64, mtime_ns: i128) -> Ident {
        Ident {
            dev: 1,
            ino,
            size,
            mtime_ns,
            ctime_ns: mtime_ns,
        }
    }

    #[test]
    fn handle_cache_is_keyed_and_revalidated_by_identity() {
        let c: IdentCache<Probe, ()> = IdentCache::new(8);
        let owner = Arc::new(());
        let (made, drops) = (AtomicUsize::new(0), Arc::new(AtomicUsize::new(0)));
        let get = |id: Ident| {
            c.get(id, &owner, || {
                made.fetch_add(1, SeqCst);
                Ok(Probe(drops.clone()))
            })
            .unwrap()
        };
        let v1 = get(ident(10, 100, 1));
        let again = get(ident(10, 100, 1));
        assert!(Arc::ptr_eq(&v1, &again), "same version: one handle");
        assert_eq!(made.load(SeqCst), 1);
        // Rewritten in place: same inode, new size or mtime or ctime -> a new handle.
        let v2 = get(ident(10, 100, 2));
        assert!(!Arc::ptr_eq(&v1, &v2));
        assert_eq!(made.load(SeqCst), 2);
        // The old handle left the cache but is still held (a transfer in flight).
        assert_eq!(drops.load(SeqCst), 0);
        drop((v1, again));
        assert_eq!(drops.load(SeqCst), 1, "dropped once its last user is done");
        let mut v3 = ident(10, 100, 2);
        v3.ctime_ns = 3;
        let v3 = get(v3);
        assert!(!Arc::ptr_eq(&v2, &v3), "a ctime change alone revalidates");
        // Another inode (the path replaced by rename) never shares a handle.
        let other = get(ident(11, 100, 2));
        assert!(!Arc::ptr_eq(&v3, &other));
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn handle_cache_remembers_refusals_per_version() {
        let c: IdentCache<Probe, ()> = IdentCache::new(8);
        let owner = Arc::new(());
        let tries = AtomicUsize::new(0);
        let get = |id: Ident| {
            c.get(id, &owner, || {
                tries.fetch_add(1, SeqCst);
                Err("refused".to_string())
            })
        };
        assert!(get(ident(5, 1, 1)).is_err());
        assert!(get(ident(5, 1, 1)).is_err());
        assert_eq!(tries.load(SeqCst), 1, "a refusal is remembered");
        assert!(get(ident(5, 2, 1)).is_err());
        assert_eq!(tries.load(SeqCst), 2, "a new version is tried again");
    }

    #[test]
    fn handle_cache_is_bounded_and_forgets_dead_files() {
        let c: IdentCache<Probe, ()> = IdentCache::new(3);
        let drops = Arc::new(AtomicUsize::new(0));
        let keep = Arc::new(());
        let make = || Ok(Probe(drops.clone()));
        let held = c.get(ident(1, 1, 1), &keep, make).unwrap();
        for ino in 2..=4 {
            c.get(ident(ino, 1, 1), &keep, make).unwrap();
        }
        assert_eq!(c.len(), 3, "capped");
        // ino 1 was least recently used: evicted, but alive while held.
        assert_eq!(drops.load(SeqCst), 0);
        drop(held);
        assert_eq!(drops.load(SeqCst), 1);
        // The backing file of an entry goes: the entry goes at the next lookup.
        let gone = Arc::new(());
        c.get(ident(9, 1, 1), &gone, make).unwrap();
        drop(gone);
        c.get(ident(2, 1, 1), &keep, make).unwrap();
        assert!(!c.inner.lock().map.contains_key(&(1, 9)));
        // or at a sweep (a file removed through the mount)
        let gone = Arc::new(());
        c.get(ident(10, 1, 1), &gone, make).unwrap();
        let before = drops.load(SeqCst);
        drop(gone);
        c.sweep();
        assert!(!c.inner.lock().map.contains_key(&(1, 10)));
        assert_eq!(drops.load(SeqCst), before + 1);
    }
}
