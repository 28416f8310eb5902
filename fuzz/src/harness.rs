//! What each fuzz target does with one input, shared by the libFuzzer binaries
//! (`fuzz/fuzz_targets/*.rs`) and the main crate's replay test
//! (`tests/fuzz_regressions.rs`, which includes this file with `#[path]`), so a saved
//! case is replayed through exactly the code that found it.
//!
//! Every function takes untrusted bytes, must return (the daemon answers errors with an
//! errno), and panics only when one of its oracles finds a wrong answer.

use h5tilefs::fs::{Caller, Fs, FsOptions, Kind, CONTROL_NAME, ROOT_INO};
use h5tilefs::geometry::{parse_tile_name, tile_name};
use h5tilefs::gpu::GpuMode;
use h5tilefs::ioctl::{self, QueryExtents};
use h5tilefs::selection::parse_slice;
use h5tilefs::staging::PendingMeta;
use std::sync::OnceLock;

/// Dimension lengths worth hitting that a one-byte encoding cannot reach.
const BIG: [u64; 7] = [
    u64::MAX,
    u64::MAX - 1,
    1 << 63,
    (1 << 62) + 1,
    1 << 32,
    i64::MAX as u64,
    1 << 40,
];

/// Reads a shape from the front of `data`: rank byte (0..=8), then one byte per dim
/// (< 0xF8: itself; 0xF8: the next 8 bytes, little endian; above: one of `BIG`).
fn take_shape(data: &[u8]) -> Option<(Vec<u64>, &[u8])> {
    let (&r, mut rest) = data.split_first()?;
    let mut shape = Vec::new();
    for _ in 0..(r % 9) {
        let (&b, r2) = rest.split_first()?;
        rest = r2;
        shape.push(match b {
            0..=0xF7 => b as u64,
            0xF8 => {
                let (n, r3) = rest.split_at_checked(8)?;
                rest = r3;
                u64::from_le_bytes(n.try_into().ok()?)
            }
            _ => BIG[(b - 0xF9) as usize],
        });
    }
    Some((shape, rest))
}

/// `slice_name`: a `slice/SEL` name against a shape, and the same name as a `tiles/I.J`
/// name against a grid of that shape. Oracles: an accepted slice stays inside the
/// dataset with a positive step; an accepted tile name is in the grid and canonical.
pub fn slice_name(data: &[u8]) {
    let Some((shape, rest)) = take_shape(data) else {
        return;
    };
    let Ok(name) = std::str::from_utf8(rest) else {
        return;
    };
    if let Ok(h) = parse_slice(name, &shape) {
        assert_eq!(h.rank(), shape.len(), "{name:?} {shape:?}");
        for (d, &len) in h.dims.iter().zip(&shape) {
            assert!(d.step >= 1, "{name:?} {shape:?}: {d:?}");
            if d.count > 0 {
                let last = d.start as u128 + (d.count as u128 - 1) * d.step as u128;
                assert!(last < len as u128, "{name:?} {shape:?}: {d:?}");
            }
        }
        let _ = h.num_elements();
    }
    if let Some(idx) = parse_tile_name(name, &shape) {
        assert_eq!(idx.len(), shape.len());
        assert!(idx.iter().zip(&shape).all(|(i, g)| i < g));
        assert_eq!(tile_name(&idx), name, "tile names are canonical");
    }
}

/// `pending_meta`: a user-written meta.json, then what the daemon does with an accepted
/// one (serve it, size it, index its tiles). Oracle: the stored form (`to_json`) parses
/// back to the same description, as `Pending::accept_meta` and `read_node` rely on.
pub fn pending_meta(data: &[u8]) {
    let Ok(m) = PendingMeta::parse(data) else {
        return;
    };
    assert!(m.shape.len() <= 32);
    assert_eq!(m.shape.len(), m.tile_shape.len());
    assert!(m.tile_shape.iter().all(|&t| t > 0));
    let _ = m.nbytes();
    let g = m.grid();
    let grid = g.grid();
    let _ = g.num_tiles();
    if grid.iter().all(|&n| n > 0) {
        let first = vec![0; grid.len()];
        let last: Vec<u64> = grid.iter().map(|n| n - 1).collect();
        for idx in [first, last] {
            let b = m
                .tile_bytes(&idx)
                .expect("a tile inside the grid has a size");
            assert!(b <= m.nbytes());
            assert_eq!(parse_tile_name(&tile_name(&idx), &grid), Some(idx));
        }
    }
    let stored = serde_json::to_vec(&m.to_json()).expect("meta serializes");
    let back = PendingMeta::parse(&stored).expect("the stored meta.json parses");
    assert_eq!(back, m, "stored meta.json round trip");
}

/// The HDF5 file the `ioctl` target serves: contiguous `/c` (8x6 f4), gzip-chunked `/z`
/// (10x7, partly unwritten), scalar `/s`, virtual `/v` over `/c`. From `gen_seeds.py`.
pub const IOCTL_BACKING: &[u8] = include_bytes!("../seeds/ioctl_backing.h5");

struct IoctlSetup {
    _dir: tempfile::TempDir,
    fs: Fs,
    /// Open handles: the control file, then per dataset meta.json, data, tile 0.
    handles: Vec<u64>,
    /// `slice/` directory inodes, one per dataset.
    slice_dirs: Vec<u64>,
}

fn ioctl_setup() -> &'static IoctlSetup {
    static SETUP: OnceLock<IoctlSetup> = OnceLock::new();
    SETUP.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("f.h5"), IOCTL_BACKING).expect("write backing file");
        let fs = Fs::new(dir.path(), quiet_opts()).expect("Fs::new");
        let look = |p: u64, n: &str| fs.lookup(p, n).unwrap_or_else(|e| panic!("{n}: {e}")).ino;
        let open = |ino: u64| open_ro(&fs, ino).expect("open").0;
        let file = look(ROOT_INO, "f.h5");
        let mut handles = vec![open(look(ROOT_INO, CONTROL_NAME))];
        let mut slice_dirs = Vec::new();
        for (ds, tile) in [("c", "0.0"), ("z", "0.0"), ("s", "0"), ("v", "0.0")] {
            let d = look(file, ds);
            handles.push(open(look(d, "meta.json")));
            handles.push(open(look(d, "data")));
            handles.push(open(look(look(d, "tiles"), tile)));
            slice_dirs.push(look(d, "slice"));
        }
        IoctlSetup {
            _dir: dir,
            fs,
            handles,
            slice_dirs,
        }
    })
}

/// Opens for reading as the daemon itself (no permission checks: not what is fuzzed).
fn open_ro(fs: &Fs, ino: u64) -> h5tilefs::error::Result<(u64, bool, bool)> {
    fs.open(ino, false, &Caller::DAEMON)
}

fn quiet_opts() -> FsOptions {
    FsOptions {
        gpu: GpuMode::Off,
        read_only: true,
        cache_bytes: 8 << 20,
        tile_bytes: 1 << 12,
        threads: 1,
        ..Default::default()
    }
}

/// `ioctl`: the daemon's ioctl entry point (`Fs::ioctl`, GPU off) with a fuzzed handle
/// (control, meta.json, data, tile, a fuzzed `slice/` name, or a bogus one), command and
/// argument bytes. The argument is sized as the kernel sizes it (from the command) unless
/// a flag says raw, and its version is made valid unless a flag says not to, so the
/// fuzzer gets past `decode`. Oracle for QUERY_EXTENTS: the runs tile the clipped range
/// in order, and every backing-file run holds the bytes `read` returns for it.
pub fn ioctl(data: &[u8]) {
    let s = ioctl_setup();
    let Some((&which, mut rest)) = data.split_first() else {
        return;
    };
    let nh = s.handles.len();
    let pick = which as usize % (nh + s.slice_dirs.len() + 1);
    let mut opened = None;
    let fh = if pick < nh {
        s.handles[pick]
    } else if pick < nh + s.slice_dirs.len() {
        let Some((&l, r)) = rest.split_first() else {
            return;
        };
        let l = (l as usize).min(r.len());
        let Ok(name) = std::str::from_utf8(&r[..l]) else {
            return;
        };
        rest = &r[l..];
        let Ok(a) = s.fs.lookup(s.slice_dirs[pick - nh], name) else {
            return;
        };
        let Ok((fh, _, _)) = open_ro(&s.fs, a.ino) else {
            s.fs.forget(a.ino, 1);
            return;
        };
        opened = Some((fh, a.ino));
        fh
    } else {
        u64::MAX - which as u64
    };
    ioctl_on(s, fh, rest);
    if let Some((fh, ino)) = opened {
        s.fs.release(fh);
        s.fs.forget(ino, 1);
    }
}

fn ioctl_on(s: &IoctlSetup, fh: u64, data: &[u8]) {
    let Some((&c, mut rest)) = data.split_first() else {
        return;
    };
    let cmd = match c & 7 {
        0 => ioctl::REGISTER_BUFFER,
        1 => ioctl::UNREGISTER_BUFFER,
        2 => ioctl::READ_TO_GPU,
        3..=5 => ioctl::QUERY_EXTENTS,
        _ => {
            let Some((n, r)) = rest.split_at_checked(4) else {
                return;
            };
            rest = r;
            u32::from_le_bytes([n[0], n[1], n[2], n[3]])
        }
    };
    let mut input = rest.to_vec();
    if c & 8 == 0 {
        // FUSE hands a restricted ioctl exactly the size encoded in its command.
        input.resize(((cmd >> 16) & 0x3fff) as usize, 0);
    }
    if c & 16 == 0 && input.len() >= 4 {
        input[..4].copy_from_slice(&ioctl::ABI_VERSION.to_ne_bytes());
    }
    let out = s.fs.ioctl(0, fh, std::process::id(), cmd, &input);
    if cmd != ioctl::QUERY_EXTENTS {
        return;
    }
    let Ok(out) = out else {
        return;
    };
    let req: QueryExtents = ioctl::decode(&input).expect("an answered request decodes");
    let q: QueryExtents = ioctl::decode(&out).expect("the reply decodes");
    let (model, sel) =
        s.fs.handle_view(fh)
            .expect("QUERY_EXTENTS answered a data file");
    let size = sel.num_elements().saturating_mul(model.itemsize());
    let start = req.file_offset.min(size);
    let end = req.file_offset.saturating_add(req.length).min(size);
    assert!(q.nruns as usize <= ioctl::MAX_RUNS && q.nfiles as usize <= ioctl::MAX_FILES);
    assert!(start <= q.next_offset && q.next_offset <= end, "{q:?}");
    let mut pos = start;
    for r in &q.runs[..q.nruns as usize] {
        assert_eq!(r.file_offset, pos, "runs are contiguous");
        assert!(r.length > 0);
        assert!(r.file_index < q.nfiles as i32);
        pos += r.length;
        if r.file_index >= 0 && r.length <= 1 << 20 {
            use std::os::unix::fs::FileExt;
            let p = &q.files[r.file_index as usize];
            let p = &p[..p.iter().position(|&b| b == 0).unwrap_or(p.len())];
            let f = std::fs::File::open(
                <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(p),
            )
            .expect("a reported backing file opens");
            let mut want = vec![0u8; r.length as usize];
            f.read_exact_at(&mut want, r.backing_offset)
                .expect("a reported backing range exists");
            let got =
                s.fs.read(fh, r.file_offset, r.length as u32)
                    .expect("read of a queried range");
            assert_eq!(got, want, "QUERY_EXTENTS run {r:?} disagrees with read");
        }
    }
    assert_eq!(pos, q.next_offset, "runs end at next_offset");
}

/// `h5_open`: the bytes as an HDF5 file in a backing directory, walked the way a client
/// walks the mount: every group and dataset directory (up to a budget), each dataset's
/// meta.json, the first and last bytes of `data`, the first and last tile, a few slices.
/// Corrupt files must give errors, not panics, hangs or huge allocations.
pub fn h5_open(data: &[u8]) {
    let Ok(dir) = tempfile::tempdir() else {
        return;
    };
    if std::fs::write(dir.path().join("f.h5"), data).is_err() {
        return;
    }
    let Ok(fs) = Fs::new(dir.path(), quiet_opts()) else {
        return;
    };
    let Ok(f) = fs.lookup(ROOT_INO, "f.h5") else {
        return;
    };
    let mut budget = 64;
    walk(&fs, f.ino, 0, &mut budget);
}

fn walk(fs: &Fs, ino: u64, depth: usize, budget: &mut usize) {
    if depth > 8 {
        return;
    }
    let Ok(entries) = fs.readdir(ino) else {
        return;
    };
    let is_dataset = entries.iter().any(|e| e.name == "meta.json");
    let mut tile_grid = None;
    for e in entries.iter().take(32) {
        if *budget == 0 {
            return;
        }
        *budget -= 1;
        if e.name == ".commit" {
            continue;
        }
        let Ok(a) = fs.lookup(ino, &e.name) else {
            continue;
        };
        match (a.kind, e.name.as_str()) {
            // a link to a group shown at its first path: read it, do not walk it
            (Kind::Symlink, _) => {
                let _ = fs.readlink(a.ino);
            }
            (Kind::File, name) => {
                let meta = read_file(fs, a.ino, a.size);
                if is_dataset && name == "meta.json" {
                    tile_grid = meta
                        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                        .and_then(|v| {
                            v.get("tile_grid")?
                                .as_array()?
                                .iter()
                                .map(|n| n.as_u64())
                                .collect::<Option<Vec<u64>>>()
                        });
                }
            }
            (Kind::Dir, "tiles") if is_dataset => {
                if let Some(g) = &tile_grid {
                    let first = vec![0; g.len()];
                    let last: Vec<u64> = g.iter().map(|n| n.saturating_sub(1)).collect();
                    for idx in [first, last] {
                        open_child(fs, a.ino, &tile_name(&idx));
                    }
                }
            }
            (Kind::Dir, "slice") if is_dataset => {
                for sel in ["()", "::2", "-1", "1:3,::3", "0:18446744073709551615:7"] {
                    open_child(fs, a.ino, sel);
                }
            }
            (Kind::Dir, _) => walk(fs, a.ino, depth + 1, budget),
        }
        fs.forget(a.ino, 1);
    }
}

fn open_child(fs: &Fs, parent: u64, name: &str) {
    if let Ok(a) = fs.lookup(parent, name) {
        read_file(fs, a.ino, a.size);
        fs.forget(a.ino, 1);
    }
}

/// Opens a file and reads its first 64 KiB and its last 4 KiB; returns the first part.
fn read_file(fs: &Fs, ino: u64, size: u64) -> Option<Vec<u8>> {
    let (fh, _, _) = open_ro(fs, ino).ok()?;
    let head = fs.read(fh, 0, 1 << 16).ok();
    if size > 1 << 16 {
        let _ = fs.read(fh, size - 4096, 4096);
    }
    fs.release(fh);
    head
}
