//! The FUSE floor: a file system with one file, `data`, whose bytes come from memory.
//! It mounts with the same kernel settings as h5tilefs (readahead, background requests,
//! worker threads, one /dev/fuse descriptor per thread), so a read benchmark run
//! against it measures what the kernel and the FUSE protocol cost by themselves: the
//! fastest h5tilefs could be with a backing store that answered instantly
//! (tests/bench/read_path_bench.py). Not installed; a benchmark tool.
//!
//!     h5tilefs-floor MOUNTPOINT SIZE_BYTES [THREADS]

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    KernelConfig, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEntry, ReplyOpen, Request,
};
use std::ffi::OsStr;
use std::time::{Duration, SystemTime};

const DATA_INO: u64 = 2;
/// The pattern every 1 MiB of `data` repeats (byte i = i mod 251: not all zeros, so
/// nothing along the way can take a shortcut for zero pages).
const PATTERN: usize = 1 << 20;

struct Floor {
    size: u64,
    pattern: Vec<u8>,
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

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent.0 == 1 && name == "data" {
            reply.entry(&TTL, &attr(DATA_INO, self.size), Generation(0))
        } else {
            reply.error(Errno::from_i32(libc::ENOENT))
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match ino.0 {
            1 | DATA_INO => reply.attr(&TTL, &attr(ino.0, self.size)),
            _ => reply.error(Errno::from_i32(libc::ENOENT)),
        }
    }

    fn open(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // no keep_cache: every open starts cold, as a fresh open of a changed file does
        reply.opened(FileHandle(0), FopenFlags::empty())
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

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let (Some(mnt), Some(size)) = (args.get(1), args.get(2).and_then(|s| s.parse::<u64>().ok()))
    else {
        eprintln!("usage: h5tilefs-floor MOUNTPOINT SIZE_BYTES [THREADS]");
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
    match fuser::mount(Floor { size, pattern }, mnt, &config) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("h5tilefs-floor: mounting {mnt}: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
