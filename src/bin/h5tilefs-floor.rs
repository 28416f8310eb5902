//! The FUSE floor: a file system with one file, `data`, whose bytes come from memory;
//! or, with `--tree LIST`, a tree of empty files and directories read from LIST (lines
//! `d PATH` / `f PATH`, as `find -printf '%y %P\n'` writes them), answered from memory
//! with READDIRPLUS: the fastest a `find` over a mount of that shape can be
//! (tests/bench/listing_bench.py).
//! It mounts with the same kernel settings as h5tilefs (readahead, background requests,
//! worker threads, one /dev/fuse descriptor per thread), so a read benchmark run
//! against it measures what the kernel and the FUSE protocol cost by themselves: the
//! fastest h5tilefs could be with a backing store that answered instantly
//! (tests/bench/read_path_bench.py). Not installed; a benchmark tool.
//!
//! With `--backing FILE OFFSET SIZE`, `data` is SIZE bytes of FILE from OFFSET, each
//! read answered with one `pread` of the backing file (no extent map, no caches): the
//! least a FUSE daemon can add to a cold read of those bytes. `H5TILEFS_FLOOR_BLOCK=B:D`
//! reads the backing file in aligned blocks of B MiB instead, D blocks ahead of the
//! reader, into memory (an experiment: does a daemon-side prefetch beat the kernel's
//! readahead?); `B:D:h` reads a request's own bytes with one pread unless its block is
//! already being read ahead, and reads ahead only the blocks after it.
//!
//! `--decode FILE DATASET CHUNKS THREADS` is no file system: it decodes the stored
//! chunks of DATASET (their bytes in CHUNKS, each a little-endian u32 length and the
//! chunk, as tests/bench/cpu_budget.py writes them with h5py's `read_direct_chunk`)
//! with the daemon's decoders on THREADS threads at once, nothing else running, and
//! prints the wall and CPU seconds: the decoding a compressed read through any version
//! of this daemon must do, measured on all CPUs together (they slow each other down).
//!
//!     h5tilefs-floor MOUNTPOINT SIZE_BYTES [THREADS]
//!     h5tilefs-floor MOUNTPOINT --tree LIST [THREADS]
//!     h5tilefs-floor MOUNTPOINT --backing FILE OFFSET SIZE [THREADS]

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    KernelConfig, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEntry,
    ReplyOpen, Request,
};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, SystemTime};

const DATA_INO: u64 = 2;
/// The pattern every 1 MiB of `data` repeats (byte i = i mod 251: not all zeros, so
/// nothing along the way can take a shortcut for zero pages).
const PATTERN: usize = 1 << 20;

struct Floor {
    size: u64,
    pattern: Vec<u8>,
    /// `--tree`: the listing to serve instead of `data`.
    tree: Option<Tree>,
    /// `--backing`: where `data`'s bytes come from.
    proxy: Option<Arc<Proxy>>,
}

/// `data` read from a backing file: one pread per request, or by blocks read ahead.
struct Proxy {
    file: std::fs::File,
    offset: u64,
    size: u64,
    /// Bytes per block; 0: one pread per request.
    block: u64,
    /// Blocks read ahead of the one a request needs.
    depth: u64,
    /// Hybrid: a request whose block is not already being read ahead reads its own
    /// bytes (one pread), and only the blocks after it are read ahead.
    hybrid: bool,
    blocks: Mutex<HashMap<u64, Arc<Slot>>>,
}

#[derive(Default)]
struct Slot {
    data: Mutex<Option<Vec<u8>>>,
    ready: Condvar,
}

impl Proxy {
    fn pread(&self, pos: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        let n = self.pread_into(pos, &mut buf);
        buf.truncate(n);
        buf
    }

    fn pread_into(&self, pos: u64, buf: &mut [u8]) -> usize {
        let mut done = 0;
        while done < buf.len() {
            match self
                .file
                .read_at(&mut buf[done..], self.offset + pos + done as u64)
            {
                Ok(0) | Err(_) => break,
                Ok(n) => done += n,
            }
        }
        done
    }

    fn fill(&self, b: u64, slot: &Slot) {
        let start = b * self.block;
        let len = self.block.min(self.size.saturating_sub(start)) as usize;
        let data = self.pread(start, len);
        *slot.data.lock().unwrap_or_else(|e| e.into_inner()) = Some(data);
        slot.ready.notify_all();
    }

    fn read(self: &Arc<Self>, pos: u64, len: usize) -> Vec<u8> {
        if self.block == 0 {
            return self.pread(pos, len);
        }
        let first = pos / self.block;
        let last = (pos + len as u64).saturating_sub(1) / self.block;
        let nblocks = self.size.div_ceil(self.block);
        let mut mine = Vec::new();
        let mut want = Vec::new();
        let mut direct = Vec::new();
        {
            let mut map = self.blocks.lock().unwrap_or_else(|e| e.into_inner());
            map.retain(|&k, _| k + 2 >= first);
            for b in first..=(last + self.depth).min(nblocks.saturating_sub(1)) {
                if self.hybrid && b <= last && !map.contains_key(&b) {
                    direct.push(b);
                    continue;
                }
                let slot = map.entry(b).or_insert_with(|| {
                    let s = Arc::new(Slot::default());
                    if b <= last {
                        mine.push((b, s.clone()));
                    } else {
                        let (p, s2) = (self.clone(), s.clone());
                        std::thread::spawn(move || p.fill(b, &s2));
                    }
                    s
                });
                if b <= last {
                    want.push((b, slot.clone()));
                }
            }
        }
        for (b, s) in &mine {
            self.fill(*b, s);
        }
        let mut out = Vec::with_capacity(len);
        let mut parts: Vec<(u64, Option<Arc<Slot>>)> =
            want.into_iter().map(|(b, s)| (b, Some(s))).collect();
        parts.extend(direct.into_iter().map(|b| (b, None)));
        parts.sort_by_key(|p| p.0);
        for (b, s) in parts {
            let Some(s) = s else {
                let bstart = b * self.block;
                let from = pos.max(bstart);
                let to = (pos + len as u64).min(bstart + self.block).min(self.size);
                out.extend_from_slice(&self.pread(from, (to - from) as usize));
                continue;
            };
            let mut g = s.data.lock().unwrap_or_else(|e| e.into_inner());
            while g.is_none() {
                g = s.ready.wait(g).unwrap_or_else(|e| e.into_inner());
            }
            let data = g.as_deref().unwrap_or(&[]);
            let bstart = b * self.block;
            let from = pos.max(bstart) - bstart;
            let to = (pos + len as u64).min(bstart + data.len() as u64) - bstart;
            if from < to {
                out.extend_from_slice(&data[from as usize..to as usize]);
            }
        }
        out
    }
}

/// A tree of names from a listing; inode i + 1 is `nodes[i]`, the root is inode 1.
#[derive(Default)]
struct Tree {
    nodes: Vec<TreeNode>,
    by_name: HashMap<(u64, String), u64>,
}

struct TreeNode {
    name: String,
    parent: u64,
    dir: bool,
    children: Vec<u64>,
}

impl Tree {
    fn load(path: &str) -> std::io::Result<Tree> {
        let text = std::fs::read_to_string(path)?;
        let mut t = Tree::default();
        t.nodes.push(TreeNode {
            name: String::new(),
            parent: 1,
            dir: true,
            children: vec![],
        });
        for line in text.lines() {
            let (kind, rel) = line.split_once(' ').unwrap_or(("", ""));
            if rel.is_empty() {
                continue;
            }
            let dir = kind == "d";
            let mut parent = 1u64;
            let parts: Vec<&str> = rel.split('/').collect();
            for (i, part) in parts.iter().enumerate() {
                let last = i + 1 == parts.len();
                let key = (parent, part.to_string());
                parent = match t.by_name.get(&key) {
                    Some(&ino) => ino,
                    None => {
                        t.nodes.push(TreeNode {
                            name: part.to_string(),
                            parent,
                            dir: !last || dir,
                            children: vec![],
                        });
                        let ino = t.nodes.len() as u64;
                        t.nodes[parent as usize - 1].children.push(ino);
                        t.by_name.insert(key, ino);
                        ino
                    }
                };
            }
        }
        Ok(t)
    }

    fn node(&self, ino: u64) -> Option<&TreeNode> {
        self.nodes.get((ino as usize).checked_sub(1)?)
    }

    /// A directory's entries as a listing pages through them: `.`, `..`, then its
    /// children, each as (inode, node).
    fn entries(&self, ino: u64) -> Option<impl Iterator<Item = (u64, &str, &TreeNode)>> {
        let n = self.node(ino)?;
        let parent = self.node(n.parent)?;
        let dots = [(ino, ".", n), (n.parent, "..", parent)];
        let children = n
            .children
            .iter()
            .filter_map(|&c| self.node(c).map(|x| (c, x.name.as_str(), x)));
        Some(dots.into_iter().chain(children))
    }

    fn attr(&self, ino: u64) -> Option<FileAttr> {
        let n = self.node(ino)?;
        let mut a = attr(if n.dir { 1 } else { DATA_INO }, 0);
        a.ino = INodeNo(ino);
        Some(a)
    }
}

fn attr(ino: u64, size: u64) -> FileAttr {
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let (kind, perm, nlink) = if ino == DATA_INO {
        (FileType::RegularFile, 0o444, 1)
    } else {
        (FileType::Directory, 0o555, 2)
    };
    FileAttr {
        ino: INodeNo(ino),
        size: if ino == DATA_INO { size } else { 0 },
        blocks: size.div_ceil(512),
        atime: now,
        mtime: now,
        ctime: now,
        crtime: now,
        kind,
        perm,
        nlink,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 1 << 20,
        flags: 0,
    }
}

const TTL: Duration = Duration::from_secs(1);

impl Filesystem for Floor {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        h5tilefs::fuse::configure_kernel(config);
        Ok(())
    }

    /// As the daemon: an OPENDIR round trip per listing, no kernel listing cache.
    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply.opened(FileHandle(0), FopenFlags::empty())
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let Some((t, all)) = self
            .tree
            .as_ref()
            .and_then(|t| Some((t, t.entries(ino.0)?)))
        else {
            return reply.error(Errno::from_i32(libc::ENOTDIR));
        };
        for (k, (child, name, _)) in all.enumerate().skip(offset as usize) {
            let Some(a) = t.attr(child) else { continue };
            if reply.add(INodeNo(child), k as u64 + 1, name, &TTL, &a, Generation(0)) {
                break;
            }
        }
        reply.ok()
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if let Some(t) = &self.tree {
            let key = (parent.0, name.to_string_lossy().into_owned());
            return match t.by_name.get(&key).and_then(|&i| t.attr(i)) {
                Some(a) => reply.entry(&TTL, &a, Generation(0)),
                None => reply.error(Errno::from_i32(libc::ENOENT)),
            };
        }
        if parent.0 == 1 && name == "data" {
            reply.entry(&TTL, &attr(DATA_INO, self.size), Generation(0))
        } else {
            reply.error(Errno::from_i32(libc::ENOENT))
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        if let Some(t) = &self.tree {
            return match t.attr(ino.0) {
                Some(a) => reply.attr(&TTL, &a),
                None => reply.error(Errno::from_i32(libc::ENOENT)),
            };
        }
        match ino.0 {
            1 | DATA_INO => reply.attr(&TTL, &attr(ino.0, self.size)),
            _ => reply.error(Errno::from_i32(libc::ENOENT)),
        }
    }

    fn open(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // no keep_cache: every open starts cold, as a fresh open of a changed file does.
        // H5TILEFS_FLOOR_DIRECT=1: direct I/O (no page cache, one copy fewer).
        let direct = std::env::var_os("H5TILEFS_FLOOR_DIRECT").is_some_and(|v| v == "1");
        let f = if direct {
            FopenFlags::FOPEN_DIRECT_IO
        } else {
            FopenFlags::empty()
        };
        reply.opened(FileHandle(0), f)
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock: Option<fuser::LockOwner>,
        reply: ReplyData,
    ) {
        let end = offset.saturating_add(size as u64).min(self.size);
        let len = end.saturating_sub(offset) as usize;
        if let Some(p) = &self.proxy {
            if p.block == 0 {
                // One reused buffer per thread, as the daemon keeps.
                thread_local!(static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) });
                return BUF.with(|b| {
                    let mut b = b.borrow_mut();
                    b.resize(len, 0);
                    let n = p.pread_into(offset, &mut b[..len]);
                    reply.data(&b[..n])
                });
            }
            return reply.data(&p.read(offset, len));
        }
        // One owned buffer per request, as the real daemon builds one.
        let mut buf = Vec::with_capacity(len);
        let mut pos = (offset % PATTERN as u64) as usize;
        while buf.len() < len {
            let n = (len - buf.len()).min(PATTERN - pos);
            buf.extend_from_slice(&self.pattern[pos..pos + n]);
            pos = 0;
        }
        reply.data(&buf)
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if let Some(t) = &self.tree {
            let Some(all) = t.entries(ino.0) else {
                return reply.error(Errno::from_i32(libc::ENOTDIR));
            };
            for (k, (child, name, node)) in all.enumerate().skip(offset as usize) {
                let kind = if node.dir {
                    FileType::Directory
                } else {
                    FileType::RegularFile
                };
                if reply.add(INodeNo(child), k as u64 + 1, kind, name) {
                    break;
                }
            }
            return reply.ok();
        }
        if ino.0 != 1 {
            return reply.error(Errno::from_i32(libc::ENOTDIR));
        }
        let all = [
            (1, FileType::Directory, "."),
            (1, FileType::Directory, ".."),
            (DATA_INO, FileType::RegularFile, "data"),
        ];
        for (i, (ino, kind, name)) in all.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(*ino), i as u64 + 1, *kind, name) {
                break;
            }
        }
        reply.ok()
    }
}

/// `--decode`: see the module comment.
fn decode_all(args: &[String]) -> Result<String, String> {
    let (Some(file), Some(name), Some(chunks), Some(threads)) = (
        args.first(),
        args.get(1),
        args.get(2),
        args.get(3).and_then(|s| s.parse::<usize>().ok()),
    ) else {
        return Err("usage: h5tilefs-floor --decode FILE DATASET CHUNKS THREADS".into());
    };
    let f = hdf5::File::open(file).map_err(|e| format!("{file}: {e}"))?;
    let ds = f.dataset(name).map_err(|e| format!("{file}/{name}: {e}"))?;
    let dcpl = h5tilefs::h5::dcpl(ds.id()).map_err(|e| e.to_string())?;
    let filters = h5tilefs::h5::filters(&dcpl).map_err(|e| e.to_string())?;
    let elem = ds.dtype().map_err(|e| e.to_string())?.size();
    let chunk: usize = ds.chunk().ok_or("not chunked")?.iter().product();
    let expect = chunk * elem;
    let raw = std::fs::read(chunks).map_err(|e| format!("{chunks}: {e}"))?;
    let mut parts = Vec::new();
    let mut at = 0usize;
    while at + 4 <= raw.len() {
        let n = u32::from_le_bytes([raw[at], raw[at + 1], raw[at + 2], raw[at + 3]]) as usize;
        let end = (at + 4).checked_add(n).filter(|&e| e <= raw.len());
        let end = end.ok_or("truncated chunk file")?;
        parts.push(&raw[at + 4..end]);
        at = end;
    }
    h5tilefs::ckernels::ready();
    let cpu = || {
        // SAFETY: getrusage fills the struct it is given.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: as above; RUSAGE_SELF covers every thread of this process.
        unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
        let s = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        s(u.ru_utime) + s(u.ru_stime)
    };
    let (c0, t) = (cpu(), std::time::Instant::now());
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failed = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(p) = parts.get(i) else { break };
                match h5tilefs::decode::decode_chunk(p.to_vec(), &filters, 0, elem, expect) {
                    Ok(v) => drop(std::hint::black_box(v)),
                    Err(_) => {
                        failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let (wall, cpu) = (t.elapsed().as_secs_f64(), cpu() - c0);
    let failed = failed.into_inner();
    if failed > 0 {
        return Err(format!("{failed} of {} chunks did not decode", parts.len()));
    }
    Ok(format!(
        "{{\"chunks\": {}, \"bytes\": {}, \"threads\": {threads}, \"wall\": {wall:.4}, \"cpu\": {cpu:.4}}}",
        parts.len(),
        parts.len() * expect
    ))
}

fn main() -> std::process::ExitCode {
    let mut args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--decode") {
        return match decode_all(&args[2..]) {
            Ok(line) => {
                println!("{line}");
                std::process::ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("h5tilefs-floor: {e}");
                std::process::ExitCode::from(2)
            }
        };
    }
    let mut tree = None;
    let mut proxy = None;
    if args.get(2).map(String::as_str) == Some("--backing") {
        let (Some(path), Some(offset), Some(size)) = (
            args.get(3).cloned(),
            args.get(4).and_then(|s| s.parse::<u64>().ok()),
            args.get(5).and_then(|s| s.parse::<u64>().ok()),
        ) else {
            eprintln!("usage: h5tilefs-floor MOUNTPOINT --backing FILE OFFSET SIZE [THREADS]");
            return std::process::ExitCode::from(2);
        };
        let file = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) => {
                eprintln!("h5tilefs-floor: {path}: {e}");
                return std::process::ExitCode::from(2);
            }
        };
        let (block, depth, hybrid) = std::env::var("H5TILEFS_FLOOR_BLOCK")
            .ok()
            .and_then(|v| {
                let (b, d) = v.split_once(':')?;
                let (d, h) = d.split_once(':').unwrap_or((d, ""));
                Some((
                    b.parse::<u64>().ok()? << 20,
                    d.parse::<u64>().ok()?,
                    h == "h",
                ))
            })
            .unwrap_or((0, 0, false));
        proxy = Some(Arc::new(Proxy {
            file,
            offset,
            size,
            block,
            depth,
            hybrid,
            blocks: Mutex::new(HashMap::new()),
        }));
        args.drain(2..5);
    } else if args.get(2).map(String::as_str) == Some("--tree") {
        let list = args.get(3).cloned().unwrap_or_default();
        match Tree::load(&list) {
            Ok(t) => tree = Some(t),
            Err(e) => {
                eprintln!("h5tilefs-floor: {list}: {e}");
                return std::process::ExitCode::from(2);
            }
        }
        args.remove(2);
        args[2] = "0".into();
    }
    let (Some(mnt), Some(size)) = (args.get(1), args.get(2).and_then(|s| s.parse::<u64>().ok()))
    else {
        eprintln!("usage: h5tilefs-floor MOUNTPOINT SIZE_BYTES [THREADS] | MOUNTPOINT --tree LIST [THREADS]");
        return std::process::ExitCode::from(2);
    };
    let threads = args
        .get(3)
        .and_then(|s| s.parse::<usize>().ok())
        .unwrap_or(8);
    let pattern = (0..PATTERN).map(|i| (i % 251) as u8).collect();
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::FSName("h5tilefs-floor".into()),
        fuser::MountOption::RO,
        fuser::MountOption::NoAtime,
    ];
    config.n_threads = Some(threads);
    config.clone_fd = true;
    match fuser::mount(
        Floor {
            size,
            pattern,
            tree,
            proxy,
        },
        mnt,
        &config,
    ) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("h5tilefs-floor: mounting {mnt}: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
