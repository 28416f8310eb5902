//! The life of one file's shared state as one explicit type.
//!
//! ```text
//!             declare / declare node / meta (/ group attributes, in a pending file)
//!   Absent ───────────────────────────────▶ Declared ──write tile──▶ Writing
//!     ▲                                       │  ▲                     │
//!     │ remove file                   commit  │  │ declare node/meta   │ commit
//!     │ (from any state)                      ▼  │                     ▼
//!     └──────────────────────────────────── Committed ◀──────── (Committing)
//!                                             │  ▲
//!                               remove object │  │ (Removing)
//!                                             └──┘
//! ```
//!
//! `Committing` and `Removing` are not stored: they are the time a daemon holds the
//! file's lock (`commit.lock` in its staging area) for that transition. Every
//! transition that changes shared state runs through [`transition`], which
//! takes the lock, reads the state from the backing directory (another node may have
//! changed it), checks the transition against [`FileState::next`], and only then runs
//! the change. A file replaced behind the daemons (a new inode at the same name) is
//! simply `Committed` with another identity: readers notice through their identity
//! checks, not through this machine.
//!
//! Lock order: a file's lock is the only lock held across I/O, and no transition
//! takes a second file's lock; in-memory maps (DashMap shards) are never held while a
//! file lock is taken or across I/O.

use super::base::has_entries;
use super::layout::{Layout, PendingFile, COMMIT_LOCK, JOURNAL};
use super::nodes::Nodes;
use crate::durable::{FileLock, Stamp};
use crate::error::{Error, PendingError, Result};
use std::path::Path;
use std::time::Duration;

/// What the backing directory says about a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileState {
    /// Neither a committed `.h5` nor pending state.
    Absent,
    /// Pending (made by mkdir, or with pending nodes), no tile written yet. `committed`:
    /// a committed version exists under it.
    Declared { committed: bool },
    /// Pending with tiles written.
    Writing { committed: bool },
    /// Only the committed file.
    Committed,
}

/// A change to a file's shared state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transition {
    /// mkdir of the file's directory.
    Declare,
    /// mkdir of a group or dataset inside it.
    DeclareNode,
    /// meta.json of a pending dataset (a different one than stored).
    AcceptMeta,
    /// A meta.json refused for a pending node: recorded there, so the commit refuses.
    RefuseMeta,
    /// rmdir of a pending node.
    RemoveNode,
    /// `.commit`.
    Commit,
    /// rmdir of a committed dataset or group.
    RemoveObject,
    /// rmdir of the file's directory.
    RemoveFile,
    /// A writer's daemon reserves room in the file being built for its encodings of
    /// a compressed chunked dataset (pending/slots.rs).
    Reserve,
    /// A Zarr group's zarr.json: the attributes of a pending file's group
    /// (pending/groups.rs).
    GroupAttrs,
}

impl FileState {
    fn committed(self) -> bool {
        match self {
            FileState::Absent => false,
            FileState::Committed => true,
            FileState::Declared { committed } | FileState::Writing { committed } => committed,
        }
    }

    /// The state after `t`, or the error that refuses it. `last_node`: the node removed
    /// by `RemoveNode` is the file's last pending node.
    pub fn next(self, t: Transition, what: &str) -> Result<FileState> {
        use FileState::*;
        use Transition::*;
        let committed = self.committed();
        let gone = || {
            Error::from(PendingError::Gone {
                what: what.to_string(),
            })
        };
        match (self, t) {
            (Absent, Declare) => Ok(Declared { committed }),
            (Committed, Declare) => Err(PendingError::Exists {
                what: what.to_string(),
            }
            .into()),
            (Declared { .. } | Writing { .. }, Declare) => Ok(self),
            // mkdir of a node in a file that is not there (removed by another process
            // or node since the kernel looked it up) would make the file pending again
            // out of nothing. A description accepted for a new file declares it (the
            // core's `accept_meta` makes the node with it).
            (Absent, DeclareNode) => Err(gone()),
            (Absent, AcceptMeta) => Ok(Declared { committed }),
            (Committed, DeclareNode | AcceptMeta) => Ok(Declared { committed }),
            (Declared { .. } | Writing { .. }, DeclareNode | AcceptMeta | RefuseMeta) => Ok(self),
            (Absent | Committed, RefuseMeta | Reserve | GroupAttrs) => Err(gone()),
            (Declared { .. } | Writing { .. }, Reserve | GroupAttrs) => Ok(self),
            (Declared { .. } | Writing { .. }, RemoveNode) => Ok(self),
            (Absent | Committed, RemoveNode) => Err(gone()),
            (Declared { .. } | Writing { .. }, Commit) => Ok(Committed),
            (Committed, Commit) => Ok(Committed),
            (Absent, Commit) => Err(gone()),
            (_, RemoveObject) if committed => Ok(self),
            (_, RemoveObject) => Err(PendingError::Gone {
                what: what.to_string(),
            }
            .into()),
            (Absent, RemoveFile) => Err(gone()),
            (_, RemoveFile) => Ok(Absent),
        }
    }
}

impl Transition {
    /// How long the transition waits for the file's lock: a commit fails with EBUSY
    /// when another runs (a second `.commit` is almost always a duplicate); the others
    /// wait for it. The commit waits [`COMMIT_LOCK_WAIT`] first: the lock may be held
    /// by a short transition of this or another daemon (a background reservation of
    /// room for encodings, a meta.json accepted a moment ago), which is not a commit
    /// running. (Seen once in the reference model: a commit right after a Zarr write
    /// failed with EBUSY while the write's background work held the lock.)
    fn wait(self) -> Duration {
        match self {
            Transition::Commit => COMMIT_LOCK_WAIT,
            _ => Duration::from_secs(LOCK_WAIT_S),
        }
    }
}

/// How long a commit waits for the file's lock before it says another commit runs.
const COMMIT_LOCK_WAIT: Duration = Duration::from_millis(500);

/// How long a transition waits for a commit or another transition of the same file.
pub const LOCK_WAIT_S: u64 = 120;

/// The file's state as the backing directory holds it now (no lock: a snapshot).
pub(super) fn state(layout: &Layout, file: &PendingFile) -> FileState {
    let committed = layout.target(file).is_file();
    if !Nodes::is_pending(layout, file) {
        return if committed {
            FileState::Committed
        } else {
            FileState::Absent
        };
    }
    let writing = Nodes::list(layout, file)
        .iter()
        .any(|n| has_entries(&layout.dataset(file, &n.path).node.join("ranges")));
    if writing {
        FileState::Writing { committed }
    } else {
        FileState::Declared { committed }
    }
}

/// Runs `change` as transition `t` of the file: under the file's lock, after
/// checking `t` against the state read under that lock. `change` gets that state.
pub(super) fn transition<T>(
    layout: &Layout,
    file: &PendingFile,
    t: Transition,
    change: impl FnOnce(FileState) -> Result<T>,
) -> Result<T> {
    let what = format!("{:?} of {}", t, file.display());
    let stage = layout.stage_dir(file);
    let lock_path = stage.join(COMMIT_LOCK);
    let _lock = match FileLock::lock(&lock_path, t.wait(), &what) {
        Err(e) if t == Transition::Commit && e.errno == libc::EBUSY => {
            return Err(PendingError::Busy {
                file: file.display().to_string(),
            }
            .into())
        }
        r => r?,
    };
    let target = layout.target(file);
    let journal = stage.join(JOURNAL);
    let (k, prev) = _lock.begin(&journal)?;
    let r = (|| {
        if let Some((want, at)) = prev {
            wait_for_version(want, at, &target, file.rel())?;
        }
        let before = state(layout, file);
        let after = before.next(t, &file.display().to_string())?;
        tracing::debug!(file = %file.display(), ?t, ?before, ?after, seq = k, "transition");
        change(before)
    })();
    // The version this transition left (changed or not), for the next holder on
    // any node. The lock file and the journal stay when the file goes: a daemon
    // waiting on the lock holds that very file, and a new one would let two in.
    _lock.finish(&journal, k, Stamp::of(&target))?;
    r
}

/// How long a transition waits for this node's view to show the version the last
/// transition (maybe on another node) left.
const VIEW_WAIT: Duration = Duration::from_secs(10);

/// How long a transition waits when its view neither matches nor is provably earlier
/// (the file was created or removed behind h5tilefs, or a lagging view shows it so):
/// a little over the 1 s attribute lag of the distributed file systems measured.
const UNKNOWN_WAIT: Duration = Duration::from_millis(2500);

/// Waits until `target` as this node sees it is the version the last transition left,
/// or a later one (changed outside h5tilefs since: a later change time), before a
/// transition starts from it. A view showing an earlier version past `VIEW_WAIT` is an
/// error (EAGAIN): starting from it would undo the other node's change.
fn wait_for_version(want: Stamp, at: (i64, i64), target: &Path, file_rel: &Path) -> Result<()> {
    let t0 = std::time::Instant::now();
    let mut wait = Duration::from_millis(2);
    loop {
        let seen = Stamp::of(target);
        let later = match (seen.ctime(), want.ctime()) {
            (Some(s), Some(w)) => s > w,
            // made outside h5tilefs after the last transition (which found no file)
            (Some(s), None) => s > at,
            // removed outside h5tilefs since, or a lagging view: only time tells; wait,
            // then go on with what is there
            (None, _) => false,
        };
        if seen == want || later {
            if t0.elapsed() > Duration::from_millis(50) {
                tracing::debug!(file = %file_rel.display(), waited_s = t0.elapsed().as_secs_f64(), "backing view caught up");
            }
            return Ok(());
        }
        let older = matches!((seen.ctime(), want.ctime()), (Some(s), Some(w)) if s < w);
        if t0.elapsed() > if older { VIEW_WAIT } else { UNKNOWN_WAIT } {
            if !older {
                tracing::warn!(file = %file_rel.display(), ?want, ?seen, "file changed outside h5tilefs since the last change through it; going on from what is there");
                return Ok(());
            }
            return Err(PendingError::ViewLagging {
                file: file_rel.display().to_string(),
                secs: VIEW_WAIT.as_secs(),
                want: format!("{want:?}"),
                seen: format!("{seen:?}"),
            }
            .into());
        }
        std::thread::sleep(wait);
        wait = (wait * 2).min(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::super::Pending;
    use super::FileState::*;
    use super::Transition::*;
    use super::*;

    /// Every (state, transition) pair: the state after it, or the errno refusing it.
    #[test]
    fn whole_table() {
        let states = [
            Absent,
            Declared { committed: false },
            Declared { committed: true },
            Writing { committed: false },
            Writing { committed: true },
            Committed,
        ];
        let ts = [
            Declare,
            DeclareNode,
            AcceptMeta,
            RefuseMeta,
            RemoveNode,
            Commit,
            RemoveObject,
            RemoveFile,
            Reserve,
        ];
        let enoent = Err(libc::ENOENT);
        for s in states {
            let committed = matches!(
                s,
                Committed | Declared { committed: true } | Writing { committed: true }
            );
            for t in ts {
                let want: std::result::Result<FileState, i32> = match (s, t) {
                    (Absent, Declare | AcceptMeta) => Ok(Declared { committed: false }),
                    (Absent, _) => enoent,
                    (Committed, Declare) => Err(libc::EEXIST),
                    (Committed, DeclareNode | AcceptMeta) => Ok(Declared { committed: true }),
                    (Committed, RemoveNode | RefuseMeta | Reserve) => enoent,
                    (Committed, Commit | RemoveObject) => Ok(Committed),
                    (_, RemoveFile) => Ok(Absent),
                    (_, Commit) => Ok(Committed),
                    (_, RemoveObject) if !committed => enoent,
                    _ => Ok(s),
                };
                let got = s.next(t, "f.h5").map_err(|e| e.errno);
                assert_eq!(got, want, "{s:?} --{t:?}-->");
            }
        }
    }

    #[test]
    fn table() {
        let w = "f.h5";
        assert_eq!(
            Absent.next(Declare, w).unwrap(),
            Declared { committed: false }
        );
        assert_eq!(Committed.next(Declare, w).unwrap_err().errno, libc::EEXIST);
        assert_eq!(
            Committed.next(AcceptMeta, w).unwrap(),
            Declared { committed: true }
        );
        assert_eq!(
            Writing { committed: true }.next(Commit, w).unwrap(),
            Committed
        );
        assert_eq!(Absent.next(Commit, w).unwrap_err().errno, libc::ENOENT);
        assert_eq!(
            Absent.next(RemoveObject, w).unwrap_err().errno,
            libc::ENOENT
        );
        assert_eq!(
            Declared { committed: false }
                .next(RemoveObject, w)
                .unwrap_err()
                .errno,
            libc::ENOENT
        );
        assert_eq!(
            Writing { committed: true }.next(RemoveObject, w).unwrap(),
            Writing { committed: true }
        );
        assert_eq!(
            Writing { committed: true }.next(RemoveFile, w).unwrap(),
            Absent
        );
        assert_eq!(
            Committed.next(RemoveNode, w).unwrap_err().errno,
            libc::ENOENT
        );
        // every state leaves by RemoveFile, except one that is not there
        for s in [
            Declared { committed: false },
            Writing { committed: false },
            Committed,
        ] {
            assert_eq!(s.next(RemoveFile, w).unwrap(), Absent);
        }
    }

    #[test]
    fn states_follow_the_backing_directory() {
        let dir = tempfile::tempdir().unwrap();
        let f = Path::new("s.h5");
        let p = Pending::new(dir.path());
        assert_eq!(p.state(f).unwrap(), Absent);
        p.create_file(f).unwrap();
        assert_eq!(p.state(f).unwrap(), Declared { committed: false });
        let m = crate::staging::PendingMeta::parse(
            br#"{"shape":[2,2],"dtype":"<i4","tile_shape":[1,2]}"#,
        )
        .unwrap();
        p.accept_meta(f, "/x", &m).unwrap();
        p.write_tile(f, "/x", &m, &[0, 0], 0, &[1u8; 8]).unwrap();
        assert_eq!(p.state(f).unwrap(), Writing { committed: false });
        p.write_tile(f, "/x", &m, &[1, 0], 0, &[2u8; 8]).unwrap();
        p.commit(f).unwrap();
        assert_eq!(p.state(f).unwrap(), Committed);
        // a second commit with nothing pending changes nothing
        p.commit(f).unwrap();
        assert_eq!(p.state(f).unwrap(), Committed);
    }

    /// A file replaced or made outside h5tilefs after the last transition (a later
    /// change time) does not stall the next one (it waited 10 s, then failed EAGAIN).
    #[test]
    fn outside_changes_do_not_stall_transitions() {
        let dir = tempfile::tempdir().unwrap();
        let f = Path::new("o.h5");
        let p = Pending::new(dir.path());
        let m = crate::staging::PendingMeta::parse(br#"{"shape":[2],"dtype":"<i4"}"#).unwrap();
        p.accept_meta(f, "/x", &m).unwrap();
        p.write_tile(f, "/x", &m, &[0], 0, &[1u8; 8]).unwrap();
        p.commit(f).unwrap();
        // replaced behind h5tilefs
        let tmp = dir.path().join("o.tmp");
        hdf5::File::create(&tmp).unwrap();
        std::fs::rename(&tmp, dir.path().join("o.h5")).unwrap();
        let t0 = std::time::Instant::now();
        p.create_node(f, "/y").unwrap();
        assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
        // removed through h5tilefs, then made outside it
        p.remove_file(f, true, || {}).unwrap();
        assert!(!dir.path().join("o.h5").exists());
        hdf5::File::create(dir.path().join("o.h5")).unwrap();
        let t0 = std::time::Instant::now();
        p.create_node(f, "/z").unwrap();
        assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    }

    /// A transition waits for another holding the file's lock instead of racing it.
    #[test]
    fn transitions_of_one_file_run_one_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let f = Path::new("t.h5");
        let a = Pending::new(dir.path());
        let b = Pending::new(dir.path());
        a.create_file(f).unwrap();
        let inside = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            for (i, p) in [&a, &b, &a, &b].into_iter().enumerate() {
                let inside = &inside;
                s.spawn(move || {
                    p.transition(f, DeclareNode, |_| {
                        let n = inside.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        assert_eq!(n, 0, "two transitions of one file at once ({i})");
                        std::thread::sleep(Duration::from_millis(20));
                        inside.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                        Ok(())
                    })
                    .unwrap();
                });
            }
        });
    }
}
