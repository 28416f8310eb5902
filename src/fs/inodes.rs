//! The daemon's inodes: one per node and version shown, with the kernel's lookup
//! counts; inodes of replaced versions are detached and kept until forgotten.

use super::attr::Attr;
use super::node::{Node, NodeKind};
use crate::error::{NamespaceError, Result};
use crate::h5file::Ident;
use crate::sync::{Counter, Family, Real, ShardMap};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

/// The mount root's inode.
pub const ROOT_INO: u64 = 1;

/// One registered node: its inode, the kernel's lookup count, the backing version it
/// was made for (`None` for nodes that do not show a committed file's bytes) and the
/// directory the kernel last looked it up in (0: unknown), for `inval_entry`.
#[derive(Clone, Copy, Debug)]
pub struct Entry {
    pub ino: u64,
    pub count: u64,
    pub version: Option<Ident>,
    pub parent: u64,
}

/// An inode given up because its node now shows another version: what the kernel must
/// be told (see `Mount::notify_stale`).
#[derive(Clone, Debug)]
pub struct Stale {
    pub ino: u64,
    pub parent: u64,
    pub node: Node,
}

/// The daemon's inodes. Generic over its primitives ([`crate::sync::Family`]) so the
/// concurrency tests run this very code under shuttle's scheduler.
pub struct InodeTable<S: Family = Real> {
    by_node: ShardMap<Node, Entry, S>,
    by_ino: ShardMap<u64, Node, S>,
    /// Inodes given up by their node (see `detach`): kernel lookup counts left.
    detached: ShardMap<u64, u64, S>,
    /// Attributes of the version a data file's inode (`data`, a tile, a slice) was
    /// made for, answered once that version is no longer current: the handles opened
    /// on it still read it, and the kernel sizes their reads by these.
    shown: ShardMap<u64, Attr, S>,
    next: S::AtomicU64,
}

impl<S: Family> InodeTable<S> {
    pub fn new() -> Self {
        let t = InodeTable {
            by_node: ShardMap::new(),
            by_ino: ShardMap::new(),
            detached: ShardMap::new(),
            shown: ShardMap::new(),
            next: S::AtomicU64::new(ROOT_INO + 1),
        };
        t.by_node.insert(
            Node::Dir(PathBuf::new()),
            Entry {
                ino: ROOT_INO,
                count: 1,
                version: None,
                parent: 0,
            },
        );
        t.by_ino.insert(ROOT_INO, Node::Dir(PathBuf::new()));
        t
    }

    /// The inode of `node` showing `version`, counting one kernel lookup made in
    /// directory `parent`. A node registered for another version gets a new inode; the
    /// old one is detached and returned, so the kernel can be told to drop it.
    /// `shown`: the attributes answered for it (kept for data files, see `shown`).
    pub fn lookup(
        &self,
        node: &Node,
        version: Option<Ident>,
        parent: u64,
        shown: Option<&Attr>,
    ) -> (u64, Option<Stale>) {
        let (ino, fresh, stale) = self.by_node.entry(node.clone(), |slot| {
            let mut fresh = false;
            let e = slot.or_insert_with(|| {
                fresh = true;
                Entry {
                    ino: self.next.fetch_add(1),
                    count: 0,
                    version,
                    parent,
                }
            });
            let mut stale = None;
            if e.version != version {
                fresh = true;
                let old = *e;
                *e = Entry {
                    ino: self.next.fetch_add(1),
                    count: 0,
                    version,
                    parent,
                };
                // Under the entry's lock, so a concurrent forget of the old inode (which
                // takes this lock first) finds its count in `detached`.
                self.retire(old.ino, old.count);
                stale = Some(Stale {
                    ino: old.ino,
                    parent: old.parent,
                    node: node.clone(),
                });
            }
            e.count += 1;
            if parent != 0 {
                e.parent = parent;
            }
            (e.ino, fresh, stale)
        });
        self.by_ino.entry(ino, |s| {
            s.or_insert_with(|| node.clone());
        });
        if let (
            true,
            Some(a),
            Node::In(_, NodeKind::Data | NodeKind::Tile { .. })
            | Node::In(_, NodeKind::Slice { .. } | NodeKind::ZarrChunk { .. }),
        ) = (fresh, shown, node)
        {
            self.shown.insert(ino, Attr { ino, ..a.clone() });
        }
        (ino, stale)
    }

    /// An inode no node maps to any more: kept while the kernel holds lookups of it.
    pub fn retire(&self, ino: u64, count: u64) {
        if count > 0 {
            self.detached.insert(ino, count);
        } else {
            self.drop_ino(ino);
        }
    }

    /// Forgets inode `ino` for good (the kernel holds no lookup of it).
    pub fn drop_ino(&self, ino: u64) {
        self.by_ino.remove(&ino);
        self.shown.remove(&ino);
    }

    /// The attributes `ino` was made with, if it is a data file's inode.
    pub fn shown(&self, ino: u64) -> Option<Attr> {
        self.shown.get(&ino)
    }

    /// The inode of `node` if it has one for `version`, else a stable pseudo number
    /// for listings.
    pub fn peek(&self, node: &Node, version: Option<Ident>) -> u64 {
        if let Some(e) = self.by_node.get(node) {
            if e.version == version {
                return e.ino;
            }
        }
        let mut h = std::collections::hash_map::DefaultHasher::new();
        node.hash(&mut h);
        version.hash(&mut h);
        h.finish() | (1 << 63)
    }

    pub fn node(&self, ino: u64) -> Result<Node> {
        self.by_ino
            .get(&ino)
            .ok_or_else(|| NamespaceError::UnknownInode(ino).into())
    }

    /// The version `ino` was made for: `Ok(None)` for unversioned nodes, `Err` when the
    /// inode was detached (it shows a version that is no longer current).
    pub fn version(&self, ino: u64, node: &Node) -> std::result::Result<Option<Ident>, ()> {
        match self.by_node.get(node) {
            Some(e) if e.ino == ino => Ok(e.version),
            _ => Err(()),
        }
    }

    pub fn forget(&self, ino: u64, n: u64) {
        if ino == ROOT_INO {
            return;
        }
        let Some(node) = self.by_ino.get(&ino) else {
            return;
        };
        // Some(gone) when the node's entry is this inode's.
        let found = self
            .by_node
            .update(&node, |e| {
                (e.ino == ino).then(|| {
                    e.count = e.count.saturating_sub(n);
                    e.count == 0
                })
            })
            .flatten();
        let Some(gone) = found else {
            let last = self.detached.update(&ino, |c| {
                *c = c.saturating_sub(n);
                *c == 0
            });
            if last == Some(true) && self.detached.remove_if(&ino, |c| *c == 0).is_some() {
                self.drop_ino(ino);
            }
            return;
        };
        // A lookup may have taken the node again since the count was read: only the one
        // that removes the node's entry drops the inode, or the kernel's inode goes stale.
        if gone
            && self
                .by_node
                .remove_if(&node, |v| v.ino == ino && v.count == 0)
                .is_some()
        {
            self.drop_ino(ino);
        }
    }

    /// Gives `node` a new inode number at its next lookup; the old one keeps answering
    /// for the kernel until forgotten. Why: after a successful rmdir the kernel marks the
    /// directory inode dead (S_DEAD) and fails every lookup inside it with ENOENT without
    /// asking us; while anything still holds it (an open file below it), handing out the
    /// same number again for the name made again (mkdir, commit) made the kernel reuse the
    /// dead inode, so the new dataset or file directory was ENOENT through this mount.
    pub fn detach(&self, node: &Node) -> Option<Stale> {
        self.detach_if(node, |_| true)
    }

    /// `detach` when `pred` holds for the node's entry, decided under the entry's lock.
    pub fn detach_if(&self, node: &Node, pred: impl FnOnce(&Entry) -> bool) -> Option<Stale> {
        self.by_node.entry(node.clone(), |slot| {
            let e = *slot.get().filter(|e| pred(e))?;
            // Under the lock, as in `lookup`.
            self.retire(e.ino, e.count);
            slot.remove();
            Some(Stale {
                ino: e.ino,
                parent: e.parent,
                node: node.clone(),
            })
        })
    }

    /// Nodes of backing file `file` registered for a version other than `current`.
    pub fn outdated(&self, file: &Path, current: Ident) -> Vec<Node> {
        let mut out = Vec::new();
        self.by_node.for_each(|node, e| {
            // Byte comparison: `Path`'s `==` compares component by component.
            if e.version.is_some_and(|v| v != current)
                && node
                    .file_and_path()
                    .is_some_and(|(f, _)| f.as_os_str() == file.as_os_str())
            {
                out.push(node.clone());
            }
        });
        out
    }

    pub fn len(&self) -> usize {
        self.by_ino.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::attr::Kind;
    use crate::sync::Shuttle;
    use std::collections::{BTreeMap, HashMap};
    use std::sync::Arc;
    use std::time::SystemTime;

    fn ident(v: u64) -> Ident {
        Ident {
            dev: 1,
            ino: 2,
            size: 3,
            mtime_ns: v as i128,
            ctime_ns: v as i128,
        }
    }

    fn attr(size: u64) -> Attr {
        Attr {
            ino: 0,
            kind: Kind::File,
            size,
            perm: 0o444,
            uid: 0,
            gid: 0,
            mtime: SystemTime::UNIX_EPOCH,
            ctime: SystemTime::UNIX_EPOCH,
            atime: SystemTime::UNIX_EPOCH,
            volatile: false,
            version: None,
        }
    }

    fn tile(i: u64) -> Node {
        Node::at(
            PathBuf::from("f.h5"),
            "/ds",
            NodeKind::Tile { idx: vec![i] },
        )
    }

    /// Every inode number maps to one node; every node's entry names an inode that maps
    /// back to it, and no two entries share one; detached inodes belong to no entry; and
    /// the lookup counts the table keeps equal what the kernel (`held`) was told and has
    /// not forgotten. Only at rest: the maps are read one shard at a time.
    fn check<S: Family>(t: &InodeTable<S>, held: &HashMap<u64, u64>) {
        let mut entries = Vec::new();
        t.by_node.for_each(|n, e| entries.push((n.clone(), *e)));
        let mut by_ino = HashMap::new();
        t.by_ino.for_each(|&i, n| {
            by_ino.insert(i, n.clone());
        });
        let mut detached = HashMap::new();
        t.detached.for_each(|&i, &c| {
            detached.insert(i, c);
        });
        let mut shown = Vec::new();
        t.shown.for_each(|&i, a| shown.push((i, a.ino)));
        let mut in_entries = HashMap::new();
        for (node, e) in &entries {
            let ino = e.ino;
            assert!(in_entries.insert(ino, e.count).is_none(), "ino {ino} twice");
            assert_eq!(by_ino.get(&ino), Some(node), "ino {ino}");
        }
        for &(i, a) in &shown {
            assert!(by_ino.contains_key(&i), "attributes of gone ino {i}");
            assert_eq!(a, i);
        }
        for d in detached.keys() {
            assert!(!in_entries.contains_key(d), "detached {d} in use");
            assert!(by_ino.contains_key(d), "detached {d} unknown");
        }
        for (&ino, &n) in held {
            let kept = in_entries
                .get(&ino)
                .or_else(|| detached.get(&ino))
                .copied()
                .unwrap_or(0);
            assert_eq!(kept, n, "lookup count of ino {ino}");
        }
        for (_, e) in &entries {
            if e.ino != ROOT_INO {
                let n = held.get(&e.ino).copied().unwrap_or(0);
                assert_eq!(e.count, n, "lookup count of ino {}", e.ino);
            }
        }
        for (d, &c) in &detached {
            let n = held.get(d).copied().unwrap_or(0);
            assert_eq!(c, n, "lookup count of detached ino {d}");
        }
        // Only inodes the kernel holds (and entries being made) stay.
        assert_eq!(
            by_ino.len(),
            1 + held
                .iter()
                .filter(|(&i, &n)| i != ROOT_INO && n > 0)
                .count(),
            "inodes known: {by_ino:?}"
        );
    }

    #[test]
    fn new_version_gets_new_inode_and_old_one_lives_until_forgotten() {
        let t = InodeTable::<Real>::new();
        let (a, s) = t.lookup(&tile(0), Some(ident(1)), 7, Some(&attr(100)));
        assert!(s.is_none());
        assert_eq!(t.lookup(&tile(0), Some(ident(1)), 7, None).0, a);
        assert_eq!(t.peek(&tile(0), Some(ident(1))), a);
        assert_ne!(t.peek(&tile(0), Some(ident(2))), a);
        let (b, s) = t.lookup(&tile(0), Some(ident(2)), 9, Some(&attr(200)));
        let s = s.expect("the old inode is reported");
        assert_ne!(a, b);
        assert_eq!((s.ino, s.parent), (a, 7));
        assert_eq!(s.node.name().as_deref(), Some("0"));
        // The old inode still answers (the kernel holds 2 lookups), as a stale one, with
        // the attributes of its own version.
        assert_eq!(t.node(a).unwrap(), tile(0));
        assert_eq!(t.shown(a).map(|x| (x.ino, x.size)), Some((a, 100)));
        assert_eq!(t.shown(b).map(|x| (x.ino, x.size)), Some((b, 200)));
        assert!(t.version(a, &tile(0)).is_err());
        assert_eq!(t.version(b, &tile(0)), Ok(Some(ident(2))));
        t.forget(a, 1);
        assert!(t.node(a).is_ok());
        t.forget(a, 1);
        assert_eq!(t.node(a).unwrap_err().errno, libc::ESTALE);
        assert!(t.shown(a).is_none());
        // Outdated nodes of the file, then detached for the new version.
        assert!(t.outdated(Path::new("f.h5"), ident(2)).is_empty());
        assert_eq!(t.outdated(Path::new("f.h5"), ident(3)), vec![tile(0)]);
        assert!(t
            .detach_if(&tile(0), |e| e.version == Some(ident(3)))
            .is_none());
        let s = t
            .detach_if(&tile(0), |e| e.version != Some(ident(3)))
            .unwrap();
        assert_eq!((s.ino, s.parent), (b, 9));
        assert_eq!(t.node(b).unwrap(), tile(0));
        t.forget(b, 1);
        check(&t, &HashMap::new());
    }

    /// Lookups of a few nodes in two versions, forgets and detaches from many threads;
    /// each thread plays a kernel that forgets only what it looked up.
    #[test]
    fn inode_table_invariants_under_concurrency() {
        let t = Arc::new(InodeTable::<Real>::new());
        let threads = 8;
        let rounds = 20_000u64;
        let barrier = Arc::new(std::sync::Barrier::new(threads));
        let handles: Vec<_> = (0..threads as u64)
            .map(|id| {
                let (t, barrier) = (t.clone(), barrier.clone());
                std::thread::spawn(move || {
                    let mut held: HashMap<u64, u64> = HashMap::new();
                    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (id + 1);
                    let mut rnd = move || {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x
                    };
                    barrier.wait();
                    for _ in 0..rounds {
                        let r = rnd();
                        let node = tile(r % 6);
                        match (r >> 8) % 10 {
                            0..=4 => {
                                let v = Some(ident(1 + (r >> 16) % 2));
                                let (ino, _) = t.lookup(&node, v, 1, Some(&attr(r % 7)));
                                assert_eq!(t.node(ino).unwrap(), node);
                                *held.entry(ino).or_default() += 1;
                            }
                            5..=8 => {
                                let Some((&ino, &n)) = held.iter().next() else {
                                    continue;
                                };
                                let k = 1 + (r >> 16) % n;
                                // Still known until the last lookup is forgotten.
                                assert!(t.node(ino).is_ok(), "ino {ino} lost while held");
                                t.forget(ino, k);
                                if n == k {
                                    held.remove(&ino);
                                } else {
                                    held.insert(ino, n - k);
                                }
                            }
                            _ => {
                                t.detach(&node);
                            }
                        }
                    }
                    held
                })
            })
            .collect();
        let mut held: HashMap<u64, u64> = HashMap::new();
        let mut all = Vec::new();
        for h in handles {
            let h = h.join().expect("thread panicked");
            for (&ino, &n) in &h {
                *held.entry(ino).or_default() += n;
            }
            all.push(h);
        }
        check(&t, &held);
        for h in all {
            for (ino, n) in h {
                t.forget(ino, n);
            }
        }
        check(&t, &HashMap::new());
        assert_eq!(t.len(), 1, "only the root is left");
        assert!(t.detached.is_empty());
        assert!(t.shown.is_empty());
    }

    // Concurrency tests under shuttle: the same InodeTable code on shuttle's locks, so
    // the checker chooses which thread runs at every lock and counter operation and
    // explores many interleavings (random and PCT schedules, all of them for the small
    // one). Each thread plays a kernel that forgets only what it looked up.

    /// One step of a thread: look up `tile(node)` showing `ident(version)`, forget one
    /// lookup of the inode held longest, forget all held, or detach `tile(node)`.
    #[derive(Clone, Copy, Debug)]
    enum Op {
        Lookup(u64, u64),
        Forget,
        ForgetAll,
        Detach(u64),
    }

    /// Runs `ops` against `t`; returns the lookups still held (the thread's ledger). An
    /// inode answers for its node from its lookup to its last forget, detached or not.
    fn play(t: &InodeTable<Shuttle>, ops: &[Op]) -> BTreeMap<u64, u64> {
        let mut held: BTreeMap<u64, u64> = BTreeMap::new();
        let answers = |ino: u64| {
            assert!(t.node(ino).is_ok(), "ino {ino} lost while held");
        };
        for op in ops {
            match *op {
                Op::Lookup(n, v) => {
                    let (ino, _) = t.lookup(&tile(n), Some(ident(v)), 1, Some(&attr(v)));
                    assert_eq!(t.node(ino).ok(), Some(tile(n)), "ino {ino}");
                    *held.entry(ino).or_default() += 1;
                }
                Op::Forget => {
                    if let Some(mut e) = held.first_entry() {
                        answers(*e.key());
                        t.forget(*e.key(), 1);
                        *e.get_mut() -= 1;
                        if *e.get() == 0 {
                            e.remove();
                        }
                    }
                }
                Op::ForgetAll => {
                    for (ino, n) in std::mem::take(&mut held) {
                        answers(ino);
                        t.forget(ino, n);
                    }
                }
                Op::Detach(n) => {
                    t.detach(&tile(n));
                }
            }
        }
        held
    }

    /// One execution: a thread per script, then the invariants (`check`) against the
    /// threads' ledgers, then every lookup left forgotten: only the root remains.
    fn run_scripts(scripts: &'static [&'static [Op]]) {
        let t = shuttle::sync::Arc::new(InodeTable::<Shuttle>::new());
        let threads: Vec<_> = scripts
            .iter()
            .map(|ops| {
                let t = t.clone();
                shuttle::thread::spawn(move || play(&t, ops))
            })
            .collect();
        let mut held = HashMap::new();
        let mut ledgers = Vec::new();
        for th in threads {
            let h = th.join().expect("thread panicked");
            for (&ino, &n) in &h {
                *held.entry(ino).or_default() += n;
            }
            ledgers.push(h);
        }
        check(&t, &held);
        for (ino, n) in ledgers.into_iter().flatten() {
            assert!(t.node(ino).is_ok(), "ino {ino} lost while held");
            t.forget(ino, n);
        }
        check(&t, &HashMap::new());
        assert_eq!(t.len(), 1, "only the root is left");
        assert!(t.detached.is_empty(), "detached inodes left");
        assert!(t.shown.is_empty(), "attributes left");
    }

    /// A forget racing the detach of its node (rmdir, a commit): the count moves to
    /// `detached` under the node's lock, so the forget finds it in one place or the other.
    const DETACH_VS_FORGET: &[&[Op]] = &[&[Op::Lookup(0, 1), Op::Forget], &[Op::Detach(0)]];

    /// Lookups of one node in two versions (a rebind detaches the old inode), forgets and
    /// detaches from three threads, over two nodes.
    const REBIND_FORGET_DETACH: &[&[Op]] = &[
        &[
            Op::Lookup(0, 1),
            Op::Lookup(1, 1),
            Op::Forget,
            Op::Lookup(0, 1),
        ],
        &[
            Op::Lookup(0, 2),
            Op::Detach(1),
            Op::Forget,
            Op::Lookup(1, 2),
        ],
        &[
            Op::Lookup(1, 1),
            Op::Detach(0),
            Op::ForgetAll,
            Op::Lookup(0, 2),
        ],
    ];

    /// The same three threads with the lookups given back at once: inodes forgotten to 0
    /// while others look the node up again or rebind it.
    const LOOKUP_FORGET_CHURN: &[&[Op]] = &[
        &[
            Op::Lookup(0, 1),
            Op::ForgetAll,
            Op::Lookup(0, 1),
            Op::Forget,
        ],
        &[Op::Lookup(0, 1), Op::Lookup(0, 2), Op::ForgetAll],
        &[
            Op::Lookup(0, 2),
            Op::Detach(0),
            Op::Lookup(0, 1),
            Op::ForgetAll,
        ],
    ];

    #[test]
    fn shuttle_detach_vs_forget_every_schedule() {
        shuttle::check_dfs(|| run_scripts(DETACH_VS_FORGET), None);
    }

    #[test]
    fn shuttle_inode_table_random_schedules() {
        shuttle::check_random(|| run_scripts(REBIND_FORGET_DETACH), 10_000);
        shuttle::check_random(|| run_scripts(LOOKUP_FORGET_CHURN), 10_000);
    }

    #[test]
    fn shuttle_inode_table_pct_schedules() {
        shuttle::check_pct(|| run_scripts(REBIND_FORGET_DETACH), 10_000, 3);
        shuttle::check_pct(|| run_scripts(LOOKUP_FORGET_CHURN), 10_000, 3);
    }
}
