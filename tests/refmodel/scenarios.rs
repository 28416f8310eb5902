//! Fixed sequences and threaded races: the cases random programs reach rarely, and the
//! divergences they found (each kept as a test that failed before its fix).

use crate::common::{ename, errno, read_fh as read_all};
use crate::generators::*;
use crate::harness::*;
use h5tilefs::fs::{Caller, ROOT_INO};
use std::collections::{BTreeMap, BTreeSet};

// ---------------------------------------------------------------------------------
// Fixed sequences: the cases the random ones reach rarely, and known divergences
// ---------------------------------------------------------------------------------

/// `[5, 6]` of `<i4` in tiles of `[2, 4]` (edge tiles clipped on both axes), fill 3.
pub(crate) fn spec56() -> Spec {
    Spec {
        dt: Dt::I32,
        shape: vec![5, 6],
        tile: vec![2, 4],
        fill: 3,
        chunked: false,
    }
}

/// f0.h5 with d0 (and d1) committed through core 0, written through `data`.
pub(crate) fn committed_f0(with_d1: bool) -> Vec<Op> {
    let mut v = vec![
        Op::CreateFile { core: 0, file: 0 },
        Op::Declare {
            core: 0,
            file: 0,
            ds: 0,
            spec: spec56(),
        },
        Op::WriteData {
            core: 1,
            at: Pick::Raw(0, 0),
            piece: None,
            seed: 7,
        },
    ];
    if with_d1 {
        v.push(Op::Declare {
            core: 2,
            file: 0,
            ds: 1,
            spec: Spec {
                dt: Dt::F64,
                ..spec56()
            },
        });
        for t in 0..6 {
            v.push(Op::WriteTile {
                core: (t % 3) as u8,
                at: Pick::Raw(0, 1),
                tile: t,
                piece: None,
                seed: 9,
            });
        }
    }
    v.push(Op::Commit { core: 2, file: 0 });
    v
}

/// Old handles (data, a tile, meta.json) on committed d0, opened through core 1.
pub(crate) fn open_d0() -> Vec<Op> {
    [Target::Data, Target::Tile(5), Target::Meta]
        .into_iter()
        .map(|target| Op::Open {
            core: 1,
            at: Pick::Raw(0, 0),
            target,
        })
        .collect()
}

pub(crate) fn read_old() -> Vec<Op> {
    (0..3).map(|k| Op::ReadOld { k }).collect()
}

pub(crate) fn seq(parts: &[Vec<Op>]) -> Vec<Op> {
    parts.concat()
}

#[test]
pub(crate) fn old_handle_after_commit_of_another_dataset() {
    let ops = seq(&[
        committed_f0(false),
        open_d0(),
        vec![Op::Declare {
            core: 2,
            file: 0,
            ds: 1,
            spec: spec56(),
        }],
        (0..6)
            .map(|t| Op::WriteTile {
                core: 0,
                at: Pick::Raw(0, 1),
                tile: t,
                piece: None,
                seed: 1,
            })
            .collect(),
        vec![Op::Commit { core: 0, file: 0 }],
        read_old(),
    ]);
    run(&ops).unwrap();
}

#[test]
pub(crate) fn old_handle_after_rmdir_of_another_dataset() {
    let ops = seq(&[
        committed_f0(true),
        open_d0(),
        vec![Op::Rmdir {
            core: 2,
            at: Pick::Raw(0, 1),
        }],
        read_old(),
    ]);
    run(&ops).unwrap();
}

#[test]
pub(crate) fn old_handle_after_rmdir_of_its_dataset() {
    let ops = seq(&[
        committed_f0(true),
        open_d0(),
        vec![Op::Rmdir {
            core: 2,
            at: Pick::Raw(0, 0),
        }],
        read_old(),
    ]);
    run(&ops).unwrap();
}

#[test]
pub(crate) fn old_handle_after_its_dataset_is_made_again() {
    let ops = seq(&[
        committed_f0(false),
        open_d0(),
        vec![
            Op::Rmdir {
                core: 0,
                at: Pick::Raw(0, 0),
            },
            Op::Declare {
                core: 2,
                file: 0,
                ds: 0,
                spec: spec56(),
            },
            Op::WriteData {
                core: 2,
                at: Pick::Raw(0, 0),
                piece: None,
                seed: 99,
            },
            Op::Commit { core: 0, file: 0 },
        ],
        read_old(),
    ]);
    run(&ops).unwrap();
}

#[test]
pub(crate) fn old_handle_after_its_file_is_removed() {
    let ops = seq(&[
        committed_f0(true),
        open_d0(),
        vec![Op::RmFile { core: 2, file: 0 }],
        read_old(),
    ]);
    run(&ops).unwrap();
}

#[test]
pub(crate) fn old_handle_after_its_file_is_replaced() {
    let ops = seq(&[
        committed_f0(true),
        open_d0(),
        vec![Op::Replace {
            file: 0,
            dsets: vec![(0, spec56(), true, 5)],
        }],
        read_old(),
        vec![Op::Read {
            core: 1,
            at: Pick::Raw(0, 0),
            target: Target::Data,
            window: (3, 17),
        }],
    ]);
    run(&ops).unwrap();
}

/// A pending dataset created before the file is replaced by one holding the same name:
/// the pending one is shown, and the commit replaces the dataset of the new file.
/// Passes before c5e4ae1; since, the commit waits 10 s and fails with EAGAIN (see
/// `bug_commit_after_the_file_was_replaced_outside`).
#[test]
pub(crate) fn pending_dataset_over_a_replaced_file() {
    let ops = seq(&[
        vec![
            Op::CreateFile { core: 0, file: 0 },
            Op::Declare {
                core: 0,
                file: 0,
                ds: 0,
                spec: spec56(),
            },
            Op::Replace {
                file: 0,
                dsets: vec![(0, spec56(), false, 5), (1, spec56(), true, 6)],
            },
            Op::List { core: 1, file: 0 },
            Op::WriteData {
                core: 1,
                at: Pick::Raw(0, 0),
                piece: None,
                seed: 3,
            },
            Op::Commit { core: 2, file: 0 },
        ],
        open_d0(),
        read_old(),
    ]);
    run(&ops).unwrap();
}

/// docs/namespace.md: "Pending tiles read back what was written (the fill value
/// elsewhere)". Before: a tile with a source file (any write to it, or any open of `data`
/// for writing, makes every tile's source) read 0 where nothing was written: the source
/// is preallocated with zeros and `DatasetModel::pending` mapped the whole tile to it.
/// Now reads take the unwritten bytes' fill value from the range logs
/// (`Fs::pending_read`). Minimal sequence found by `reference_model`: `[3]` of `|u1`,
/// tile `[2]`, fill 1; write one byte at offset 1 of `data`; `data` read `[0, x, 0]`,
/// not `[1, x, 1]`.
#[test]
pub(crate) fn bug_pending_unwritten_bytes_read_as_fill() {
    let ops = vec![
        Op::CreateFile { core: 0, file: 0 },
        Op::Declare {
            core: 0,
            file: 0,
            ds: 0,
            spec: Spec {
                dt: Dt::U8,
                shape: vec![3],
                tile: vec![2],
                fill: 1,
                chunked: false,
            },
        },
        Op::WriteData {
            core: 0,
            at: Pick::Raw(0, 0),
            piece: Some((1, 0)),
            seed: 0,
        },
        Op::Read {
            core: 1,
            at: Pick::Raw(0, 0),
            target: Target::Data,
            window: (0, 3),
        },
    ];
    run(&ops).unwrap();
}

// ---------------------------------------------------------------------------------
// Threads on two cores
// ---------------------------------------------------------------------------------

/// Commits `file` through `fs` until it succeeds; an incomplete dataset (the other
/// threads are still writing) or a commit or removal in progress answer with an error
/// that a caller retries. Returns the errors seen, by errno.
pub(crate) fn commit_until_ok(fs: &Core, file: &str) -> Result<BTreeMap<i32, usize>, String> {
    let mut seen = BTreeMap::new();
    let t0 = std::time::Instant::now();
    loop {
        let r = (|| {
            let ino = resolve(fs, &[file, ".commit"])?;
            let (fh, _, _) = errno(fs.open(ino, true, &Caller::DAEMON))?;
            let w = errno(fs.write(fh, 0, b"1"));
            fs.release(fh);
            w.map(|_| ())
        })();
        match r {
            Ok(()) => return Ok(seen),
            Err(e) if [libc::ENODATA, libc::EBUSY].contains(&e) => {
                *seen.entry(e).or_default() += 1;
            }
            Err(e) => return Err(format!("commit of {file}: {}", ename(e))),
        }
        if t0.elapsed() > std::time::Duration::from_secs(15) {
            return Err(format!("commit of {file}: no success in 15 s ({seen:?})"));
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Writes tile `t` of pending `file/d` in two pieces, second half first.
pub(crate) fn write_tile_in_halves(
    fs: &Core,
    file: &str,
    d: &str,
    spec: &Spec,
    full: &[u8],
    t: usize,
) {
    let bytes = spec.tile_bytes(full, t);
    let ino = resolve(fs, &[file, d, "tiles", &spec.tile_name(t)]).expect("tile lookup");
    let (fh, _, _) = fs.open(ino, true, &Caller::DAEMON).expect("open tile");
    let h = bytes.len() / 2;
    fs.write(fh, h as u64, &bytes[h..]).expect("write tile");
    fs.write(fh, 0, &bytes[..h]).expect("write tile");
    fs.release(fh);
}

/// Two cores, four threads, one file: two threads write the tiles of pending dataset `w`
/// (alternate tiles, through both cores) and then commit until the commit goes through,
/// while two others remove committed datasets `c0` and `c1` of the same file, one through
/// each core. Every operation must succeed, and the committed file (read with the `hdf5`
/// crate, and through both cores) must hold exactly `c2` and `w`, with their bytes.
#[test]
pub(crate) fn threads_write_tiles_while_removals_and_commits_race() {
    let rounds: usize = std::env::var("REFMODEL_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12);
    let c_spec = Spec {
        dt: Dt::I32,
        shape: vec![6, 6],
        tile: vec![3, 4],
        fill: 0,
        chunked: false,
    };
    let w_spec = Spec {
        dt: Dt::F64,
        shape: vec![8, 8],
        tile: vec![2, 2],
        fill: 0,
        chunked: false,
    };
    let mut failures = Vec::new();
    let mut retried: BTreeMap<i32, usize> = BTreeMap::new();
    for round in 0..rounds {
        let tmp = tempfile::tempdir().expect("tempdir");
        let a = Core::new(tmp.path(), false);
        let b = Core::new(tmp.path(), false);
        let f = "f.h5";
        // Committed c0, c1, c2 through core a.
        a.mkdir(ROOT_INO, f, 0o755, 0, 0).expect("mkdir file");
        let fi = resolve(&a, &[f]).expect("file");
        let mut c_data = Vec::new();
        for c in 0..3 {
            let name = format!("c{c}");
            let n = a.mkdir(fi, &name, 0o755, 0, 0).expect("mkdir c");
            let (_, fh) = a.create(n.ino, "meta.json").expect("create meta");
            a.write(fh, 0, &c_spec.meta_json()).expect("meta");
            a.release(fh);
            let full = bytes(c as u8, 77, c_spec.nbytes());
            for t in 0..c_spec.ntiles() {
                write_tile_in_halves(&a, f, &name, &c_spec, &full, t);
            }
            c_data.push(full);
        }
        commit_until_ok(&a, f).expect("first commit");
        // Pending w through core b.
        let n = b.mkdir(fi_of(&b, f), "w", 0o755, 0, 0).expect("mkdir w");
        let (_, fh) = b.create(n.ino, "meta.json").expect("create meta");
        b.write(fh, 0, &w_spec.meta_json()).expect("meta");
        b.release(fh);
        let w_full = bytes(round as u8, 88, w_spec.nbytes());
        let barrier = std::sync::Barrier::new(4);
        let results: Vec<Result<BTreeMap<i32, usize>, String>> = std::thread::scope(|s| {
            let (a, b, barrier, w_full, w_spec) = (&a, &b, &barrier, &w_full, &w_spec);
            let writer = |fs: &'static str, parity: usize| {
                move || -> Result<BTreeMap<i32, usize>, String> {
                    let core = if fs == "a" { a } else { b };
                    barrier.wait();
                    for t in (parity..w_spec.ntiles()).step_by(2) {
                        write_tile_in_halves(core, f, "w", w_spec, w_full, t);
                    }
                    commit_until_ok(core, f)
                }
            };
            let remover = |fs: &'static str, name: &'static str| {
                move || -> Result<BTreeMap<i32, usize>, String> {
                    let core = if fs == "a" { a } else { b };
                    let fi = resolve(core, &[f]).map_err(ename)?;
                    barrier.wait();
                    core.rmdir(fi, name)
                        .map(|_| BTreeMap::new())
                        .map_err(|e| format!("rmdir {name} through core {fs}: {e}"))
                }
            };
            let hs = vec![
                s.spawn(writer("a", 0)),
                s.spawn(writer("b", 1)),
                s.spawn(remover("a", "c0")),
                s.spawn(remover("b", "c1")),
            ];
            hs.into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err("thread panicked".into())))
                .collect()
        });
        for seen in results.iter().flatten() {
            for (e, n) in seen {
                *retried.entry(*e).or_default() += n;
            }
        }
        let mut problems: Vec<String> = results.into_iter().filter_map(|r| r.err()).collect();
        // The committed file as the HDF5 library reads it.
        match hdf5::File::open(tmp.path().join(f)) {
            Err(e) => problems.push(format!("open f.h5: {e}")),
            Ok(h) => {
                let mut names = h.member_names().unwrap_or_default();
                names.sort();
                if names != ["c2", "w"] {
                    problems.push(format!("f.h5 holds {names:?}, not [c2, w]"));
                }
                let w: Option<Vec<f64>> = h.dataset("w").and_then(|d| d.read_raw()).ok();
                let w_bytes: Option<Vec<u8>> =
                    w.map(|v| v.iter().flat_map(|x| x.to_le_bytes()).collect());
                if w_bytes.as_deref() != Some(w_full.as_slice()) {
                    problems.push("w does not hold the bytes written".into());
                }
                let c2: Option<Vec<i32>> = h.dataset("c2").and_then(|d| d.read_raw()).ok();
                let c2_bytes: Option<Vec<u8>> =
                    c2.map(|v| v.iter().flat_map(|x| x.to_le_bytes()).collect());
                if c2_bytes.as_deref() != Some(c_data[2].as_slice()) {
                    problems.push("c2 does not hold its bytes".into());
                }
            }
        }
        // And through both cores.
        for (cname, core) in [("a", &a), ("b", &b)] {
            let got = resolve(core, &[f, "w", "data"])
                .and_then(|ino| errno(core.open(ino, false, &Caller::DAEMON)))
                .and_then(|(fh, _, _)| {
                    let r = read_all(core, fh);
                    core.release(fh);
                    r
                });
            if got.as_deref() != Ok(w_full.as_slice()) {
                problems.push(format!("w/data through core {cname} differs"));
            }
            let listed: Result<BTreeSet<String>, i32> = resolve(core, &[f])
                .and_then(|ino| errno(core.readdir(ino)))
                .map(|v| {
                    v.into_iter()
                        .map(|e| e.name)
                        .filter(|n| !n.starts_with('.') && n != "zarr.json")
                        .collect()
                });
            let want: BTreeSet<String> = ["c2".to_string(), "w".to_string()].into();
            if listed.as_ref() != Ok(&want) {
                problems.push(format!("core {cname} lists {listed:?}"));
            }
        }
        if !problems.is_empty() {
            failures.push(format!("round {round}: {}", problems.join("; ")));
        }
    }
    eprintln!(
        "threads: {rounds} rounds, {} diverged; commits retried (errno: count) {retried:?}",
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

pub(crate) fn fi_of(fs: &Core, file: &str) -> u64 {
    resolve(fs, &[file]).expect("file lookup")
}

/// docs/namespace.md: "Pending tiles read back what was written". Before: a read handle
/// on a pending `data` (or tile) opened before a tile's first write kept reading the fill
/// value for that tile, even after the write went through the same core: the handle's
/// model mapped only the tile sources that existed at open. Now each read looks up the
/// sources its window lacks again (`Fs::refresh_pending`). Minimal sequence found by
/// `reference_model`: declare `[1]` of `|u1` (fill 1), open `data` for reading, write
/// tile 0, read through the open handle: 1, not the byte written.
#[test]
pub(crate) fn bug_open_pending_handle_misses_tiles_written_later() {
    let ops = vec![
        Op::CreateFile { core: 0, file: 0 },
        Op::Declare {
            core: 0,
            file: 0,
            ds: 0,
            spec: Spec {
                dt: Dt::U8,
                shape: vec![1],
                tile: vec![2],
                fill: 1,
                chunked: false,
            },
        },
        Op::Open {
            core: 0,
            at: Pick::Raw(0, 0),
            target: Target::Data,
        },
        Op::WriteTile {
            core: 0,
            at: Pick::Raw(0, 0),
            tile: 0,
            piece: None,
            seed: 0,
        },
        Op::ReadOld { k: 0 },
    ];
    run(&ops).unwrap();
}

/// A file removed through core 0 while core 1's kernel still holds its directory's
/// dentry (the 1 s entry TTL of a committed file): `mkdir f0.h5/d0` through core 1 must
/// fail with ENOENT, as below a removed directory on a POSIX file system. Before: it
/// succeeded and made f0.h5 again as a pending file, shown on every mount; now
/// `Pending::create_node` refuses a file the state machine finds absent. Minimal
/// sequence found by `reference_model`.
#[test]
pub(crate) fn bug_mkdir_below_a_stale_file_dentry_makes_the_file_again() {
    let ops = vec![
        Op::Replace {
            file: 0,
            dsets: vec![],
        },
        // core 1 walks to f0.h5 (a committed file: its dentry is cached for 1 s)
        Op::List { core: 1, file: 0 },
        Op::RmFile { core: 0, file: 0 },
        Op::Declare {
            core: 1,
            file: 0,
            ds: 0,
            spec: spec56(),
        },
    ];
    run(&ops).unwrap();
}

/// Core 1 reads committed `f0.h5/d1/data` (its kernel keeps the dentry 1 s); the file is
/// replaced without d1 and core 0 declares d1 again as a pending dataset and writes
/// it. Reading `d1/data` through core 1 then fails with ENOENT: `Fs::open` takes the
/// cached inode's `Node::Data`, whose committed dataset is gone, while a fresh walk
/// (`Fs::child` on `Node::Dataset`) reaches the pending data. Writes through such a
/// dentry are redirected for tiles only (`Node::Tile` -> `Node::PTile` in `Fs::open`);
/// `data` and `meta.json` fail with EROFS. Minimal sequence found by `reference_model`.
#[test]
pub(crate) fn bug_stale_data_dentry_of_a_dataset_made_pending_again() {
    let ops = vec![
        Op::Replace {
            file: 0,
            dsets: vec![(1, spec56(), true, 1)],
        },
        Op::Read {
            core: 1,
            at: Pick::Raw(0, 1),
            target: Target::Data,
            window: (0, 0),
        },
        Op::Replace {
            file: 0,
            dsets: vec![],
        },
        Op::Declare {
            core: 0,
            file: 0,
            ds: 1,
            spec: spec56(),
        },
        Op::WriteData {
            core: 0,
            at: Pick::Raw(0, 1),
            piece: None,
            seed: 4,
        },
        Op::Read {
            core: 1,
            at: Pick::Raw(0, 1),
            target: Target::Data,
            window: (0, 0),
        },
    ];
    run(&ops).unwrap();
}

/// Every rank declares the dataset (the `to_file` pattern: each writes the same
/// `meta.json`) and writes its own tiles: four threads on two cores, started together.
/// `mkdir` may answer EEXIST (another rank made the node first) and nothing else may
/// fail; the committed dataset must hold every rank's bytes. This is where a tile
/// source generation published after `meta.json` showed: a rank that saw the accepted
/// meta before the generation failed its tile writes.
#[test]
pub(crate) fn ranks_declaring_one_dataset_through_two_cores() {
    let rounds: usize = std::env::var("REFMODEL_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24);
    let spec = Spec {
        dt: Dt::I32,
        shape: vec![8, 6],
        tile: vec![2, 3],
        fill: 0,
        chunked: false,
    };
    let mut failures = Vec::new();
    for round in 0..rounds {
        let tmp = tempfile::tempdir().expect("tempdir");
        let a = Core::new(tmp.path(), false);
        let b = Core::new(tmp.path(), false);
        let f = "f.h5";
        a.mkdir(ROOT_INO, f, 0o755, 0, 0).expect("mkdir file");
        let full = bytes(round as u8, 55, spec.nbytes());
        let barrier = std::sync::Barrier::new(4);
        let results: Vec<Result<(), String>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|rank| {
                    let core = if rank % 2 == 0 { &a } else { &b };
                    let (barrier, spec, full) = (&barrier, &spec, &full);
                    s.spawn(move || -> Result<(), String> {
                        let fi = resolve(core, &[f]).map_err(ename)?;
                        barrier.wait();
                        match core.mkdir(fi, "w", 0o755, 0, 0) {
                            Ok(_) => {}
                            Err(e) if e.errno == libc::EEXIST => {}
                            Err(e) => return Err(format!("rank {rank}: mkdir w: {e}")),
                        }
                        let wi = resolve(core, &[f, "w"])
                            .map_err(|e| format!("rank {rank}: lookup w: {}", ename(e)))?;
                        // open(O_CREAT): the existing meta.json, else a new one
                        let fh = match core.lookup(wi, "meta.json") {
                            Ok(m) => core.open(m.ino, true, &Caller::DAEMON).map(|h| h.0),
                            Err(_) => core.create(wi, "meta.json").map(|h| h.1),
                        }
                        .map_err(|e| format!("rank {rank}: open meta.json: {e}"))?;
                        let w = core.write(fh, 0, &spec.meta_json());
                        let fl = core.flush(fh);
                        core.release(fh);
                        w.map_err(|e| format!("rank {rank}: write meta.json: {e}"))?;
                        fl.map_err(|e| format!("rank {rank}: close meta.json: {e}"))?;
                        for t in (rank..spec.ntiles()).step_by(4) {
                            let bytes = spec.tile_bytes(full, t);
                            let r = resolve(core, &[f, "w", "tiles", &spec.tile_name(t)])
                                .and_then(|ino| errno(core.open(ino, true, &Caller::DAEMON)))
                                .and_then(|(fh, _, _)| {
                                    let w = errno(core.write(fh, 0, &bytes));
                                    core.release(fh);
                                    w
                                });
                            r.map_err(|e| format!("rank {rank}: write tile {t}: {}", ename(e)))?;
                        }
                        commit_until_ok(core, f).map(|_| ())
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err("thread panicked".into())))
                .collect()
        });
        let mut problems: Vec<String> = results.into_iter().filter_map(|r| r.err()).collect();
        let got: Option<Vec<u8>> = hdf5::File::open(tmp.path().join(f))
            .and_then(|h| h.dataset("w"))
            .and_then(|d| d.read_raw::<i32>())
            .ok()
            .map(|v| v.iter().flat_map(|x| x.to_le_bytes()).collect());
        if got.as_deref() != Some(full.as_slice()) {
            problems.push("committed w does not hold every rank's bytes".into());
        }
        if !problems.is_empty() {
            failures.push(format!("round {round}: {}", problems.join("; ")));
        }
    }
    eprintln!("ranks: {rounds} rounds, {} diverged", failures.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `rmdir` of a pending group that holds a pending dataset: POSIX answers ENOTEMPTY
/// (or, as `rm -r` would leave it, the dataset goes with its group). The dataset must
/// not stay pending unseen and come back at the next commit. Before: the rmdir
/// succeeded (`Pending::remove_node` dropped only the group's own node directory), `g/d`
/// stayed pending unseen, and the next commit made `/g/d`. Now: ENOTEMPTY.
#[test]
pub(crate) fn bug_rmdir_of_a_pending_group_with_a_dataset_inside() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let a = Core::new(tmp.path(), false);
    let f = "f.h5";
    a.mkdir(ROOT_INO, f, 0o755, 0, 0).expect("mkdir file");
    let fi = resolve(&a, &[f]).expect("file");
    let g = a.mkdir(fi, "g", 0o755, 0, 0).expect("mkdir g");
    let d = a.mkdir(g.ino, "d", 0o755, 0, 0).expect("mkdir g/d");
    let spec = Spec {
        dt: Dt::U8,
        shape: vec![4],
        tile: vec![4],
        fill: 0,
        chunked: false,
    };
    let (_, fh) = a.create(d.ino, "meta.json").expect("create meta");
    a.write(fh, 0, &spec.meta_json()).expect("meta");
    a.release(fh);
    let full = bytes(1, 1, 4);
    let t = resolve(&a, &[f, "g", "d", "tiles", "0"]).expect("tile lookup");
    let (fh, _, _) = a.open(t, true, &Caller::DAEMON).expect("open tile");
    a.write(fh, 0, &full).expect("write tile");
    a.release(fh);
    let r = errno(a.rmdir(fi, "g"));
    let listed: BTreeSet<String> = a
        .readdir(fi)
        .expect("readdir")
        .into_iter()
        .map(|e| e.name)
        .filter(|n| !n.starts_with('.'))
        .collect();
    commit_until_ok(&a, f).expect("commit");
    let names = hdf5::File::open(tmp.path().join(f))
        .and_then(|h| h.member_names())
        .unwrap_or_default();
    match r {
        Err(e) => {
            assert_eq!(e, libc::ENOTEMPTY, "rmdir g: {}", ename(e));
            assert!(listed.contains("g"), "g failed to go but is not listed");
            assert_eq!(names, vec!["g".to_string()]);
        }
        Ok(()) => {
            assert!(
                !listed.contains("g"),
                "g removed but still listed: {listed:?}"
            );
            assert!(
                names.is_empty(),
                "g removed (with g/d inside) but the commit made {names:?}"
            );
        }
    }
}

/// A commit through core a races `rmdir` of a complete pending dataset `p` of the same
/// file through core b (the rmdir starts a little later each round, 0 to 6 ms, to sweep
/// the commit's phases; a race: how often a bug shows depends on the machine's load).
/// Serial orders both end without `p` (commit then rmdir removes the committed `p`),
/// so: if the rmdir succeeded, `p` must be absent from the file; if `p` is there, it
/// must hold its bytes (never the fill value of deleted tile sources). An rmdir that
/// answers ENOENT because the commit took `p` first leaves `p` committed, intact.
/// Before removals of pending nodes went through the file's lock (f397aaa), 24 of 96
/// rounds (run alone) ended with both succeeding and the committed `p` reading as its
/// fill value: the rmdir deleted the tile sources under the commit.
#[test]
pub(crate) fn commit_races_rmdir_of_a_pending_dataset() {
    commit_race(false);
}

/// As above, with `rmdir` of the whole file (`rm -r` of its directory) through core b:
/// if that succeeded, the file must be gone afterwards. Before f397aaa, 26 of 96 rounds
/// ended with both succeeding and the commit's rename making the removed file again,
/// its new dataset reading as the fill value.
#[test]
pub(crate) fn commit_races_rmdir_of_the_file() {
    commit_race(true);
}

/// Commit through core a, racing a removal through core b (see the two tests above).
pub(crate) fn commit_race(whole_file: bool) {
    let rounds: usize = std::env::var("REFMODEL_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(48);
    let spec = Spec {
        dt: Dt::I32,
        shape: vec![8, 8],
        tile: vec![2, 2],
        fill: 5,
        chunked: false,
    };
    let mut failures = Vec::new();
    let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
    for round in 0..rounds {
        let tmp = tempfile::tempdir().expect("tempdir");
        let a = Core::new(tmp.path(), false);
        let b = Core::new(tmp.path(), false);
        let f = "f.h5";
        a.mkdir(ROOT_INO, f, 0o755, 0, 0).expect("mkdir file");
        let fi = resolve(&a, &[f]).expect("file");
        let mut data = BTreeMap::new();
        for name in ["c", "p"] {
            let n = a.mkdir(fi, name, 0o755, 0, 0).expect("mkdir");
            let (_, fh) = a.create(n.ino, "meta.json").expect("create meta");
            a.write(fh, 0, &spec.meta_json()).expect("meta");
            a.release(fh);
            let full = bytes(round as u8, name.len() + 3, spec.nbytes());
            for t in 0..spec.ntiles() {
                write_tile_in_halves(&a, f, name, &spec, &full, t);
            }
            data.insert(name, full);
            if name == "c" {
                commit_until_ok(&a, f).expect("commit c");
            }
        }
        let barrier = std::sync::Barrier::new(2);
        let delay = std::time::Duration::from_micros(125 * (round as u64 % 48));
        let (commit, rmdir) = std::thread::scope(|s| {
            let c = s.spawn(|| {
                barrier.wait();
                let ino = resolve(&a, &[f, ".commit"])?;
                let (fh, _, _) = errno(a.open(ino, true, &Caller::DAEMON))?;
                let w = errno(a.write(fh, 0, b"1"));
                a.release(fh);
                w.map(|_| ())
            });
            let r = s.spawn(|| {
                let fi = resolve(&b, &[f])?;
                barrier.wait();
                std::thread::sleep(delay);
                if whole_file {
                    errno(b.rmdir(ROOT_INO, f))
                } else {
                    errno(b.rmdir(fi, "p"))
                }
            });
            (c.join().unwrap_or(Err(-1)), r.join().unwrap_or(Err(-1)))
        });
        let h = hdf5::File::open(tmp.path().join(f));
        let p: Option<Result<Vec<u8>, String>> = match &h {
            Ok(h) => match h.dataset("p") {
                Err(_) => None,
                Ok(d) => Some(
                    d.read_raw::<i32>()
                        .map(|v| v.iter().flat_map(|x| x.to_le_bytes()).collect())
                        .map_err(|e| e.to_string()),
                ),
            },
            Err(_) if whole_file && !tmp.path().join(f).exists() => None,
            Err(e) => Some(Err(format!("open f.h5: {e}"))),
        };
        let outcome = format!(
            "commit {}, rmdir{} {}, p {}",
            commit.map(|_| "ok".into()).unwrap_or_else(ename),
            if whole_file { " of the file" } else { "" },
            rmdir.map(|_| "ok".into()).unwrap_or_else(ename),
            match &p {
                None => "absent",
                Some(Ok(b)) if b == &data["p"] => "intact",
                Some(Ok(_)) => "WRONG BYTES",
                Some(Err(_)) => "UNREADABLE",
            }
        );
        *outcomes.entry(outcome.clone()).or_default() += 1;
        let file_back = whole_file && tmp.path().join(f).exists();
        let bad = match (&rmdir, &p) {
            (Ok(()), _) if file_back => true,
            (_, Some(Err(_))) if !whole_file => true,
            (_, Some(Ok(b))) if b != &data["p"] => true,
            (Ok(()), Some(_)) => true,
            _ => false,
        };
        if bad {
            failures.push(format!("round {round} (rmdir {delay:?} later): {outcome}"));
        }
    }
    eprintln!("commit vs rmdir (whole file: {whole_file}): {rounds} rounds, outcomes {outcomes:?}");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The same through a committed group: `g` committed with dataset `g/c`, then pending
/// `g/p` declared and written, then `rmdir g`. It was rewritten without `g` while the
/// pending `g/p` stayed, and the next commit made `/g` again with `p` in it; now the
/// rmdir is ENOTEMPTY.
#[test]
pub(crate) fn bug_rmdir_of_a_committed_group_with_a_pending_dataset_inside() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let a = Core::new(tmp.path(), false);
    let f = "f.h5";
    let spec = Spec {
        dt: Dt::U8,
        shape: vec![4],
        tile: vec![4],
        fill: 0,
        chunked: false,
    };
    a.mkdir(ROOT_INO, f, 0o755, 0, 0).expect("mkdir file");
    let declare = |name: &str| {
        let fi = resolve(&a, &[f]).expect("file");
        let g = match resolve(&a, &[f, "g"]) {
            Ok(g) => g,
            Err(_) => a.mkdir(fi, "g", 0o755, 0, 0).expect("mkdir g").ino,
        };
        let d = a.mkdir(g, name, 0o755, 0, 0).expect("mkdir dataset");
        let (_, fh) = a.create(d.ino, "meta.json").expect("create meta");
        a.write(fh, 0, &spec.meta_json()).expect("meta");
        a.release(fh);
        let t = resolve(&a, &[f, "g", name, "tiles", "0"]).expect("tile lookup");
        let (fh, _, _) = a.open(t, true, &Caller::DAEMON).expect("open tile");
        a.write(fh, 0, &bytes(2, 2, 4)).expect("write tile");
        a.release(fh);
    };
    declare("c");
    commit_until_ok(&a, f).expect("commit g/c");
    declare("p");
    let fi = resolve(&a, &[f]).expect("file");
    let r = errno(a.rmdir(fi, "g"));
    commit_until_ok(&a, f).expect("commit");
    let names = hdf5::File::open(tmp.path().join(f))
        .and_then(|h| h.member_names())
        .unwrap_or_default();
    match r {
        // as for a pending group: rmdir the pending datasets inside first (`rm -r`
        // does); the group and both datasets stay
        Err(e) => {
            assert_eq!(e, libc::ENOTEMPTY, "rmdir g: {}", ename(e));
            assert_eq!(names, vec!["g".to_string()]);
            let inside = hdf5::File::open(tmp.path().join(f))
                .and_then(|h| h.group("g")?.member_names())
                .unwrap_or_default();
            assert_eq!(inside, vec!["c".to_string(), "p".to_string()]);
        }
        Ok(()) => assert!(
            names.is_empty(),
            "g removed (with pending g/p inside) but the commit made {names:?}"
        ),
    }
}

/// A pending dataset declared in a committed group (so no pending node stands for the
/// group), then the file replaced by one without that group. Before: the pending dataset
/// was still there (`.status` listed it, the next commit made it and its group again),
/// but `g` was neither listed nor found, so it could not be read, written or removed
/// until then. Now `g` is shown while pending nodes below it need it (`Fs::resolve`).
#[test]
pub(crate) fn bug_pending_dataset_of_a_vanished_group_is_hidden() {
    let spec = Spec {
        dt: Dt::U8,
        shape: vec![4],
        tile: vec![2],
        fill: 0,
        chunked: false,
    };
    let ops = vec![
        Op::CreateFile { core: 0, file: 0 },
        Op::Declare {
            core: 0,
            file: 0,
            ds: 3, // g/d0
            spec: spec.clone(),
        },
        Op::WriteData {
            core: 0,
            at: Pick::Raw(0, 3),
            piece: None,
            seed: 1,
        },
        Op::Commit { core: 0, file: 0 },
        Op::Declare {
            core: 1,
            file: 0,
            ds: 4, // g/d1, in the committed group
            spec,
        },
        Op::Replace {
            file: 0,
            dsets: vec![],
        },
        Op::Read {
            core: 2,
            at: Pick::Raw(0, 4),
            target: Target::Data,
            window: (0, 0),
        },
    ];
    run(&ops).unwrap();
}

/// docs/namespace.md: a backing file replaced outside h5tilefs (rename over it) is
/// served as the new file, and "committing a file that exists keeps its other
/// datasets". Since c5e4ae1 every transition (a new node's mkdir, as here, a commit,
/// a dataset's rmdir, `rm -r` of the file) first waits for the file to show the version
/// the last transition stamped in its lock file: a replaced file never does, so it
/// waits 10 s and fails with EAGAIN ("the backing file system's client cache is stale or the file was
/// changed outside h5tilefs; retry"), and every retry does the same: the file can no
/// longer be changed through h5tilefs. Minimal sequence found by `reference_model`.
#[test]
pub(crate) fn bug_commit_after_the_file_was_replaced_outside() {
    let ops = vec![
        Op::CreateFile { core: 0, file: 0 },
        Op::Commit { core: 0, file: 0 },
        Op::Replace {
            file: 0,
            dsets: vec![(0, spec56(), true, 1)],
        },
        Op::Declare {
            core: 1,
            file: 0,
            ds: 1,
            spec: spec56(),
        },
        Op::WriteData {
            core: 1,
            at: Pick::Raw(0, 1),
            piece: None,
            seed: 2,
        },
        Op::Commit { core: 2, file: 0 },
    ];
    run(&ops).unwrap();
}

/// The extent map of a pending handle (what READ_TO_GPU and QUERY_EXTENTS plan from,
/// `Fs::handle_view`) shows the fill value where whole elements were never written, as
/// `read` does; before, it mapped every tile with a source to it whole (zeros there).
/// An element written in part reads as the fill value through it (a documented limit).
#[test]
pub(crate) fn extent_map_of_a_pending_dataset_shows_the_fill_value() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let a = Core::new(tmp.path(), false);
    let f = "f.h5";
    a.mkdir(ROOT_INO, f, 0o755, 0, 0).expect("mkdir file");
    let fi = resolve(&a, &[f]).expect("file");
    let d = a.mkdir(fi, "d", 0o755, 0, 0).expect("mkdir d");
    let spec = Spec {
        dt: Dt::I32,
        shape: vec![6],
        tile: vec![4],
        fill: 7,
        chunked: false,
    };
    let (_, fh) = a.create(d.ino, "meta.json").expect("create meta");
    a.write(fh, 0, &spec.meta_json()).expect("meta");
    a.release(fh);
    let data = resolve(&a, &[f, "d", "data"]).expect("data");
    let (w, _, _) = a.open(data, true, &Caller::DAEMON).expect("open data");
    a.write(w, 4, &5i32.to_le_bytes()).expect("write element 1");
    a.write(w, 8, &[1]).expect("write a byte of element 2");
    a.release(w);
    let want = |partial: i32| -> Vec<u8> {
        [7, 5, partial, 7, 7, 7]
            .iter()
            .flat_map(|v: &i32| v.to_le_bytes())
            .collect()
    };
    let cache = std::sync::Arc::new(h5tilefs::decode::CellCache::new(1 << 20));
    for target in [vec![f, "d", "data"], vec![f, "d", "tiles", "0"]] {
        let ino = resolve(&a, &target).expect("lookup");
        let (fh, _, _) = a.open(ino, false, &Caller::DAEMON).expect("open");
        let (model, sel) = a.handle_view(fh).expect("handle_view");
        let n = sel.num_elements() * model.itemsize();
        let got = h5tilefs::model::read_selection(&model, &sel, 0, n, &cache).expect("read");
        let host = read_all(&a, fh).expect("read");
        a.release(fh);
        let k = n as usize;
        // the host read is exact to the byte; the extent map to the element
        assert_eq!(host, want(1)[..k], "{target:?} read");
        assert_eq!(got, want(7)[..k], "{target:?} extent map");
    }
}

/// docs/namespace.md: a different meta.json replaces the accepted one only while no tile
/// has been opened for writing. An open for writing makes the tile's source in the
/// layout the meta gives; a write past the tile's end is refused (EFBIG) before anything
/// is written, and the dataset still counts as written, so the new meta is EBUSY with
/// the way out (rmdir) in its message. Found by the reference model once its core driver
/// flushed at close as the kernel does (the docs said "written" then).
#[test]
fn a_write_open_fixes_the_meta() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let a = Core::new(tmp.path(), false);
    let spec = Spec {
        dt: Dt::U8,
        shape: vec![1],
        tile: vec![2],
        fill: 0,
        chunked: false,
    };
    a.mkdir(ROOT_INO, "f.h5", 0o755, 0, 0).expect("mkdir file");
    let fi = resolve(&a, &["f.h5"]).expect("file");
    let d = a.mkdir(fi, "d", 0o755, 0, 0).expect("mkdir d");
    let (_, fh) = a.create(d.ino, "meta.json").expect("create meta");
    a.write(fh, 0, &spec.meta_json()).expect("meta");
    a.flush(fh).expect("flush meta");
    a.release(fh);
    let tile = resolve(&a, &["f.h5", "d", "tiles", "0"]).expect("tile");
    let (fh, _, _) = a.open(tile, true, &Caller::DAEMON).expect("open tile");
    let e = a.write(fh, 0, &[1, 2]).expect_err("past the end");
    assert_eq!(e.errno, libc::EFBIG);
    a.flush(fh).expect("flush");
    a.release(fh);
    let meta = resolve(&a, &["f.h5", "d", "meta.json"]).expect("meta");
    let (fh, _, _) = a.open(meta, true, &Caller::DAEMON).expect("open meta");
    let other = Spec { fill: 1, ..spec };
    let w = a.write(fh, 0, &other.meta_json());
    a.release(fh);
    let e = w.expect_err("a different meta.json after a write open");
    assert_eq!(e.errno, libc::EBUSY, "{e}");
    assert!(e.to_string().contains("rmdir the dataset"), "{e}");
}

/// A child spawned while this process had an HDF5 file open for writing inherits the
/// descriptor, and with it libhdf5's lock of the file (a `flock`, held per open file);
/// the lock outlives the writer's close for as long as the child lives. The core's open
/// fails meanwhile, and that failure must not stick: once the lock is gone the file
/// reads as the HDF5 file it is (a tile write of its dataset answers EROFS), not as "not
/// an HDF5 file" (ENOENT) for as long as the file is unchanged. The reference model's
/// rare failure (seed 20261123: a mount daemon spawned by `replay_through_a_mount`).
#[test]
pub(crate) fn a_lock_held_by_an_inheriting_child_does_not_stick() {
    use crate::drivers::Driver;
    let tmp = tempfile::tempdir().expect("tempdir");
    let backing = tmp.path().join("backing");
    std::fs::create_dir(&backing).expect("mkdir backing");
    let scratch = tmp.path().join("new.h5");
    let core = Core::new(&backing, false);
    let mut child = {
        // libhdf5's file lock is on in this process (the daemon turns it off).
        let f = hdf5::File::create(&scratch).expect("create h5");
        f.new_dataset::<i32>()
            .shape([4, 4])
            .create("d0")
            .expect("dataset")
            .write_raw(&[7i32; 16])
            .expect("write");
        std::process::Command::new("sleep")
            .arg("2")
            .spawn()
            .expect("spawn sleep")
    };
    std::fs::rename(&scratch, backing.join("f0.h5")).expect("rename in");
    let tile = ["f0.h5", "d0", "tiles", "0.0"];
    let during = core.write_at(&tile, 0, &[0; 4]);
    assert_eq!(
        during.map_err(ename),
        Err(ename(libc::EAGAIN)),
        "while the lock is held"
    );
    child.wait().expect("wait sleep");
    assert_eq!(
        core.write_at(&tile, 0, &[0; 4]).map_err(ename),
        Err(ename(libc::EROFS)),
        "after the lock is gone"
    );
}
