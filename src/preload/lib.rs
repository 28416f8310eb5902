//! `libh5tilefs_preload.so`, the interception library of `h5tilefs run` (docs/direct.md).
//!
//! FUSE stays the control plane; this library moves the bulk bytes. When a program opens
//! a file of an h5tilefs mount read-only, the library asks the daemon (DIRECT_MAP ioctl)
//! where the file's bytes live. If they are verbatim bytes of backing files, it opens
//! those files itself, with the program's own credentials (the kernel checks them), and
//! checks each is the inode the daemon named. Then `read`, `pread`, `readv`, `preadv`,
//! `fread` (glibc, when the stream's buffer is empty) and read-only `mmap` of that
//! descriptor are served from the backing files; bytes the daemon must produce (fill,
//! decoded chunks) are still read through the FUSE descriptor. Everything else passes to
//! libc untouched.
//!
//! An entry belongs to one open file description: it holds a hidden duplicate of the
//! descriptor, and every call first checks with `kcmp(KCMP_FILE)` that the caller's
//! descriptor still is that description (a descriptor closed behind the library's back,
//! e.g. by glibc's internal `fclose`, and reused, is dropped instead of misread).
//! The file offset stays the kernel's: `read` moves it with `lseek`, so `dup`, `fork`
//! and `ftell` see what they would through FUSE.
//!
//! Internal I/O uses raw system calls, never the interposed symbols, and a thread-local
//! flag passes through calls made while the library itself is running.

// The exported functions keep libc's own contracts; their docs are libc's manual pages.
#![allow(clippy::missing_safety_doc)]

mod abi;

use libc::{c_int, iovec, ssize_t};
use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};

// ---------------------------------------------------------------------------------------
// State

/// One open file description served direct.
struct Entry {
    /// A duplicate of the caller's descriptor: keeps the description alive so `kcmp`
    /// comparisons stay meaningful.
    hidden: c_int,
    map: abi::Map,
    /// Backing descriptors, as `map.files`.
    fds: Vec<c_int>,
    /// Serializes `read`'s lseek–pread–lseek on one description.
    offset: Mutex<()>,
}

impl Drop for Entry {
    fn drop(&mut self) {
        sys_close(self.hidden);
        for &fd in &self.fds {
            sys_close(fd);
        }
    }
}

static TABLE: RwLock<Option<HashMap<c_int, Arc<Entry>>>> = RwLock::new(None);
/// Entries in TABLE: a process with none pays one atomic load per call.
static TRACKED: AtomicUsize = AtomicUsize::new(0);
static DISABLED: AtomicBool = AtomicBool::new(false);
/// Device numbers of h5tilefs mounts, and of other file systems seen.
static DEVS: RwLock<(Vec<u64>, Vec<u64>)> = RwLock::new((Vec::new(), Vec::new()));

/// Backing reads from this size on are announced with POSIX_FADV_WILLNEED first
/// (`H5TILEFS_DIRECT_WILLNEED=0` turns that off, for comparisons).
const WILLNEED_FROM: u64 = 1 << 20;
static NO_WILLNEED: AtomicBool = AtomicBool::new(false);

/// Tiles smaller than this (1 MiB; `H5TILEFS_DIRECT_WRITE_FROM=BYTES` sets it, 0 maps
/// every tile) are written through FUSE: for a 256 KiB tile the map, the backing open
/// and the two RECORD_WRITE round trips cost more than FUSE's one write request
/// (0.28 against 0.47 GB/s, docs/direct.md).
static WRITE_FROM: AtomicU64 = AtomicU64::new(1 << 20);

/// Writes go to a backing file in pieces of this size, each recorded once written, so
/// the daemon starts each piece's writeback as it does for FUSE's 1 MiB write requests.
/// Writing 16 MiB before each record ran at 0.7 GB/s on the dev VM where 1 MiB pieces
/// and FUSE ran at 2.6 (two 256 MiB tiles, docs/perf-log 2026-11-29 small-tile writes).
const WRITE_PIECE: u64 = 1 << 20;

static DIRECT_BYTES: AtomicU64 = AtomicU64::new(0);
static FUSE_BYTES: AtomicU64 = AtomicU64::new(0);
static OPENS_DIRECT: AtomicU64 = AtomicU64::new(0);
static OPENS_FUSE: AtomicU64 = AtomicU64::new(0);
static MMAPS_DIRECT: AtomicU64 = AtomicU64::new(0);
static WRITTEN_BYTES: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static BUSY: Cell<bool> = const { Cell::new(false) };
}

/// Marks the library's own code on this thread; `None` when already inside it.
struct Busy;
impl Busy {
    fn enter() -> Option<Busy> {
        if BUSY.with(|b| b.replace(true)) {
            None
        } else {
            Some(Busy)
        }
    }
}
impl Drop for Busy {
    fn drop(&mut self) {
        BUSY.with(|b| b.set(false));
    }
}

// ---------------------------------------------------------------------------------------
// Raw system calls (never the interposed symbols)

fn errno() -> c_int {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

fn sys_close(fd: c_int) {
    // SAFETY: closes a descriptor this library owns.
    unsafe { libc::syscall(libc::SYS_close, fd) };
}

fn sys_lseek(fd: c_int, off: i64, whence: c_int) -> i64 {
    // SAFETY: lseek takes no pointers (and is not interposed).
    unsafe { libc::lseek64(fd, off, whence) }
}

/// Calls `call(done)`, one pread or pwrite of the bytes from `done` on, until `len`
/// bytes are done, a call returns 0 or one fails with an error other than EINTR.
/// Returns the bytes done and the error that stopped it.
fn sys_io_loop(len: u64, mut call: impl FnMut(u64) -> libc::c_long) -> (u64, Option<c_int>) {
    let mut done = 0u64;
    while done < len {
        let r = call(done);
        if r < 0 {
            let e = errno();
            if e == libc::EINTR {
                continue;
            }
            return (done, Some(e));
        }
        if r == 0 {
            break;
        }
        done += r as u64;
    }
    (done, None)
}

/// pread until `len` bytes, end of file or an error other than EINTR.
///
/// # Safety
/// `buf` must be valid for `len` bytes of writes.
unsafe fn sys_pread_full(fd: c_int, buf: *mut u8, len: u64, off: u64) -> Result<u64, c_int> {
    let (done, err) = sys_io_loop(len, |done| {
        // SAFETY: `buf + done .. buf + len` is inside the caller's buffer.
        unsafe {
            libc::syscall(
                libc::SYS_pread64,
                fd,
                buf.add(done as usize),
                (len - done) as usize,
                (off + done) as i64,
            )
        }
    });
    match err {
        Some(e) if done == 0 => Err(e),
        _ => Ok(done),
    }
}

/// pwrite all `len` bytes (retrying EINTR and short writes); a write of 0 is EIO.
///
/// # Safety
/// `buf` must be valid for `len` bytes of reads.
unsafe fn sys_pwrite_all(fd: c_int, buf: *const u8, len: u64, off: u64) -> Result<(), c_int> {
    let (put, err) = sys_io_loop(len, |put| {
        // SAFETY: `buf + put .. buf + len` is inside the caller's buffer.
        unsafe {
            libc::syscall(
                libc::SYS_pwrite64,
                fd,
                buf.add(put as usize),
                (len - put) as usize,
                (off + put) as i64,
            )
        }
    });
    match err {
        Some(e) => Err(e),
        None if put < len => Err(libc::EIO),
        None => Ok(()),
    }
}

fn sys_fstat(fd: c_int) -> Option<libc::stat> {
    // SAFETY: an all-zero stat is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid stat buffer (fstat is not interposed).
    let r = unsafe { libc::fstat(fd, &mut st) };
    (r == 0).then_some(st)
}

/// This process's id (getpid is a system call in glibc ≥ 2.25); reset in a forked child.
static PID: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

extern "C" fn after_fork_in_child() {
    // SAFETY: getpid takes no arguments.
    PID.store(unsafe { libc::getpid() }, Relaxed);
}

/// Whether descriptor `fd` of this process is the open file description `hidden` is.
fn same_description(fd: c_int, hidden: c_int) -> bool {
    let mut pid = PID.load(Relaxed);
    if pid == 0 {
        // SAFETY: getpid takes no arguments.
        pid = unsafe { libc::getpid() };
    }
    // SAFETY: kcmp takes no pointers for KCMP_FILE.
    unsafe {
        libc::syscall(libc::SYS_kcmp, pid, pid, 0 /* KCMP_FILE */, fd, hidden) == 0
    }
}

/// Moves a descriptor of ours above the numbers a program expects `open` to return.
fn to_high(fd: c_int) -> c_int {
    let mut rl = libc::rlimit {
        rlim_cur: 1024,
        rlim_max: 1024,
    };
    // SAFETY: `rl` is a valid rlimit.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) };
    let floor = (rl.rlim_cur.min(1 << 20) * 3 / 4).max(3) as c_int;
    // SAFETY: fcntl(F_DUPFD_CLOEXEC) takes an integer.
    let hi = unsafe { libc::syscall(libc::SYS_fcntl, fd, libc::F_DUPFD_CLOEXEC, floor) } as c_int;
    if hi < 0 {
        // SAFETY: as above, lowest free number.
        return unsafe { libc::syscall(libc::SYS_fcntl, fd, libc::F_DUPFD_CLOEXEC, 0) } as c_int;
    }
    hi
}

// ---------------------------------------------------------------------------------------
// libc's own symbols

macro_rules! real {
    ($name:literal, fn($($t:ty),*) -> $r:ty) => {{
        static P: AtomicUsize = AtomicUsize::new(0);
        let mut p = P.load(Relaxed);
        if p == 0 {
            // SAFETY: dlsym with a NUL-terminated name.
            p = unsafe { libc::dlsym(libc::RTLD_NEXT, concat!($name, "\0").as_ptr().cast()) }
                as usize;
            P.store(p, Relaxed);
        }
        if p == 0 {
            None
        } else {
            // SAFETY: the symbol `$name` of the next object has this C signature.
            Some(unsafe { std::mem::transmute::<usize, unsafe extern "C" fn($($t),*) -> $r>(p) })
        }
    }};
}

fn missing<T: From<i8>>() -> T {
    set_errno(libc::ENOSYS);
    T::from(-1)
}

// ---------------------------------------------------------------------------------------
// Tracking

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;

extern "C" fn init() {
    let _b = Busy::enter();
    if std::env::var_os("H5TILEFS_DIRECT").is_some_and(|v| v == "0") {
        DISABLED.store(true, Relaxed);
        return;
    }
    if std::env::var_os("H5TILEFS_DIRECT_WILLNEED").is_some_and(|v| v == "0") {
        NO_WILLNEED.store(true, Relaxed);
    }
    if let Some(n) = std::env::var("H5TILEFS_DIRECT_WRITE_FROM")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
    {
        WRITE_FROM.store(n, Relaxed);
    }
    after_fork_in_child();
    // SAFETY: registers a plain extern "C" function for the child side of fork.
    unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
    // kcmp is how an entry proves its descriptor; without it nothing goes direct.
    let fd = sys_open_ro(c"/proc/self/exe");
    if fd < 0 || !same_description(fd, fd) {
        DISABLED.store(true, Relaxed);
    }
    sys_close(fd);
    if std::env::var_os("H5TILEFS_DIRECT_STATS").is_some() {
        // SAFETY: registers a plain extern "C" function.
        unsafe { libc::atexit(write_stats) };
    }
}

/// Writes the counters now, for a process that will leave with `_exit` (atexit
/// handlers do not run then): benchmarks' forked writers call it through ctypes.
#[no_mangle]
pub extern "C" fn h5tilefs_direct_stats_flush() {
    write_stats();
}

/// Appends one JSON line of counters to `$H5TILEFS_DIRECT_STATS` (tests, benchmarks).
extern "C" fn write_stats() {
    let _b = Busy::enter();
    let Some(path) = std::env::var_os("H5TILEFS_DIRECT_STATS") else {
        return;
    };
    let line = format!(
        "{{\"pid\": {}, \"direct_bytes\": {}, \"fuse_bytes\": {}, \"opens_direct\": {}, \
         \"opens_fuse\": {}, \"mmaps_direct\": {}, \"written_bytes\": {}, \"disabled\": {}}}\n",
        std::process::id(),
        DIRECT_BYTES.load(Relaxed),
        FUSE_BYTES.load(Relaxed),
        OPENS_DIRECT.load(Relaxed),
        OPENS_FUSE.load(Relaxed),
        MMAPS_DIRECT.load(Relaxed),
        WRITTEN_BYTES.load(Relaxed),
        DISABLED.load(Relaxed),
    );
    use std::io::Write;
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
    {
        let _ = f.write_all(line.as_bytes());
    }
}

fn sys_open_wo(path: &std::ffi::CStr) -> c_int {
    // SAFETY: a NUL-terminated path; no mode without O_CREAT.
    unsafe {
        libc::syscall(
            libc::SYS_openat,
            libc::AT_FDCWD,
            path.as_ptr(),
            libc::O_WRONLY | libc::O_CLOEXEC,
        ) as c_int
    }
}

fn sys_open_ro(path: &std::ffi::CStr) -> c_int {
    // SAFETY: a NUL-terminated path; no mode for O_RDONLY.
    unsafe {
        libc::syscall(
            libc::SYS_openat,
            libc::AT_FDCWD,
            path.as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        ) as c_int
    }
}

/// Whether `dev` is an h5tilefs mount, from /proc/self/mountinfo (read again for a
/// device not seen before, so a mount made after start is found).
fn is_h5tilefs(dev: u64) -> bool {
    if let Ok(d) = DEVS.read() {
        if d.0.contains(&dev) {
            return true;
        }
        if d.1.contains(&dev) {
            return false;
        }
    }
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut ours = Vec::new();
    for l in info.lines() {
        let Some((pre, post)) = l.split_once(" - ") else {
            continue;
        };
        let mut post = post.split(' ');
        let fstype = post.next().unwrap_or("");
        let source = post.next().unwrap_or("");
        if fstype != "fuse.h5tilefs" && !(fstype == "fuse" && source.starts_with("h5tilefs:")) {
            continue;
        }
        // Any user may mount a FUSE file system of that name: only a daemon of root or
        // of this user is believed about which files to open (and write).
        let owner = post
            .next()
            .unwrap_or("")
            .split(',')
            .find_map(|o| o.strip_prefix("user_id="))
            .and_then(|u| u.parse::<u32>().ok());
        // SAFETY: getuid takes no arguments.
        let me = unsafe { libc::getuid() };
        if !owner.is_some_and(|u| u == 0 || u == me) {
            continue;
        }
        let Some((ma, mi)) = pre.split(' ').nth(2).and_then(|m| m.split_once(':')) else {
            continue;
        };
        if let (Ok(ma), Ok(mi)) = (ma.parse::<u32>(), mi.parse::<u32>()) {
            ours.push(libc::makedev(ma, mi));
        }
    }
    let yes = ours.contains(&dev);
    if let Ok(mut d) = DEVS.write() {
        d.0 = ours;
        if !yes && d.1.len() < 256 {
            d.1.push(dev);
        }
    }
    yes
}

/// Drops the entry of descriptor `fd` (closed, or reused behind our back).
fn forget(fd: c_int) {
    if TRACKED.load(Relaxed) == 0 {
        return;
    }
    let old = match TABLE.write() {
        Ok(mut t) => t.as_mut().and_then(|t| t.remove(&fd)),
        Err(_) => None,
    };
    if old.is_some() {
        TRACKED.fetch_sub(1, Relaxed);
    }
    // The entry's descriptors close here, outside the lock, once no call holds it.
    drop(old);
}

fn insert(fd: c_int, e: Arc<Entry>) {
    let old = match TABLE.write() {
        Ok(mut t) => {
            let old = t.get_or_insert_with(HashMap::new).insert(fd, e);
            if old.is_none() {
                TRACKED.fetch_add(1, Relaxed);
            }
            old
        }
        Err(_) => None,
    };
    drop(old);
}

/// The entry of `fd`, if it is still the description the entry was built for.
fn lookup(fd: c_int) -> Option<Arc<Entry>> {
    if TRACKED.load(Relaxed) == 0 || fd < 0 {
        return None;
    }
    // try_read: a signal handler's write, or a child forked while another thread held
    // the lock, must not wait for it; FUSE is always a correct fallback.
    let e = TABLE.try_read().ok()?.as_ref()?.get(&fd)?.clone();
    if same_description(fd, e.hidden) {
        Some(e)
    } else {
        drop(e);
        forget(fd);
        None
    }
}

/// The entry of `fd` if it is mapped for reading.
fn lookup_read(fd: c_int) -> Option<Arc<Entry>> {
    lookup(fd).filter(|e| !e.map.write)
}

/// The entry of `fd` if it is a pending tile mapped for writing.
fn lookup_write(fd: c_int) -> Option<Arc<Entry>> {
    lookup(fd).filter(|e| e.map.write)
}

/// A descriptor duplicated from `from` shares its entry.
fn share(from: c_int, to: c_int) {
    if to < 0 || TRACKED.load(Relaxed) == 0 {
        return;
    }
    forget(to);
    if let Some(e) = lookup(from) {
        insert(to, e);
    }
}

/// After a successful open of `fd` with `flags`: maps it if it is a read-only data file
/// of an h5tilefs mount whose bytes the daemon says are backing bytes.
fn track(fd: c_int, flags: c_int) {
    if fd < 0 {
        return;
    }
    forget(fd); // a number reused after a close the library did not see
                // Read-only opens are mapped for reading; opens for writing (not appending) of a
                // pending tile for writing, whose reads then go through FUSE.
    let write = flags & libc::O_ACCMODE != libc::O_RDONLY;
    if DISABLED.load(Relaxed)
        || flags & (libc::O_PATH | libc::O_DIRECTORY) != 0
        || (write && flags & libc::O_APPEND != 0)
    {
        return;
    }
    let Some(_b) = Busy::enter() else {
        return;
    };
    let Some(st) = sys_fstat(fd) else {
        return;
    };
    if st.st_mode & libc::S_IFMT != libc::S_IFREG || !is_h5tilefs(st.st_dev) {
        return;
    }
    if write && (st.st_size as u64) < WRITE_FROM.load(Relaxed) {
        OPENS_FUSE.fetch_add(1, Relaxed);
        return;
    }
    match build(fd, write, st.st_size as u64) {
        Some(e) => {
            OPENS_DIRECT.fetch_add(1, Relaxed);
            insert(fd, Arc::new(e));
        }
        None => {
            OPENS_FUSE.fetch_add(1, Relaxed);
        }
    }
}

/// Asks the daemon for the map, opens and checks its backing files. A map for writing
/// must cover exactly the tile (`size`, the mount's own st_size of it): no reply can
/// make the library write past the tile.
fn build(fd: c_int, write: bool, size: u64) -> Option<Entry> {
    let mut b = abi::Builder::default();
    loop {
        let mut req = abi::DirectMap::request(b.pos());
        // SAFETY: DIRECT_MAP reads and writes one DirectMap, which `req` is.
        let r = unsafe { libc::ioctl(fd, abi::DIRECT_MAP as _, &mut req as *mut abi::DirectMap) };
        if r != 0 {
            return None;
        }
        match b.add(&req) {
            Ok(true) => break,
            Ok(false) => continue,
            Err(why) => {
                tracing_off(why);
                return None;
            }
        }
    }
    let map = b.finish();
    if map.files.is_empty() {
        return None; // nothing to read direct: every byte comes from the daemon
    }
    if map.write != write
        || (write && (map.size != size || map.runs.iter().any(|r| r.file.is_none())))
    {
        tracing_off("a map of another kind than the open");
        return None;
    }
    let mut fds: Vec<c_int> = Vec::with_capacity(map.files.len());
    let close_all = |fds: &[c_int]| fds.iter().for_each(|&f| sys_close(f));
    for f in &map.files {
        let low = if write {
            sys_open_wo(&f.path)
        } else {
            sys_open_ro(&f.path)
        };
        if low < 0 {
            close_all(&fds);
            return None;
        }
        let bfd = to_high(low);
        sys_close(low);
        let ok = bfd >= 0
            && sys_fstat(bfd).is_some_and(|st| {
                st.st_dev == f.ident.dev
                    && st.st_ino == f.ident.ino
                    && (write || st.st_size as u64 == f.ident.size)
                    && (st
                        .st_mtime
                        .saturating_mul(1_000_000_000)
                        .saturating_add(st.st_mtime_nsec)
                        == f.ident.mtime_ns
                        || write)
            });
        if bfd >= 0 {
            fds.push(bfd);
        }
        if !ok {
            close_all(&fds);
            return None;
        }
    }
    let hidden = to_high(fd);
    if hidden < 0 {
        close_all(&fds);
        return None;
    }
    Some(Entry {
        hidden,
        map,
        fds,
        offset: Mutex::new(()),
    })
}

/// Why a map was refused, for `H5TILEFS_DIRECT_DEBUG=1`.
fn tracing_off(why: &str) {
    if std::env::var_os("H5TILEFS_DIRECT_DEBUG").is_some() {
        eprintln!("h5tilefs direct: read through FUSE: {why}");
    }
}

// ---------------------------------------------------------------------------------------
// The data path

/// Reads `n` bytes at `off` of the view into `buf`: backing runs from their files, the
/// rest through the FUSE descriptor. Returns bytes read, or -errno.
///
/// # Safety
/// `buf` must be valid for `n` bytes of writes.
unsafe fn pread_entry(e: &Entry, buf: *mut u8, n: usize, off: u64) -> Result<u64, c_int> {
    // The hidden duplicate is the caller's open file description under a number no
    // other thread can close and reuse meanwhile.
    let fd = e.hidden;
    let size = e.map.size;
    if off >= size || n == 0 {
        return Ok(0);
    }
    let want = (n as u64).min(size - off);
    let mut done = 0u64;
    let mut i = e.map.find(off);
    while done < want && i < e.map.runs.len() {
        let r = e.map.runs[i];
        let pos = off + done;
        let into = pos - r.start;
        let take = (r.len - into).min(want - done);
        // SAFETY: `done + take <= want <= n`.
        let dst = unsafe { buf.add(done as usize) };
        let got = match r.file {
            // SAFETY: dst is valid for `take` bytes.
            Some(f) => {
                if take >= WILLNEED_FROM && !NO_WILLNEED.load(Relaxed) {
                    // One pread is one stream the kernel reads ahead of by a window; asking
                    // for the whole range first queues all of it at once (a cold 8 MiB
                    // tile on a virtual disk: see docs/direct.md). Cached pages cost a lookup.
                    // SAFETY: fadvise takes no pointers.
                    unsafe {
                        libc::posix_fadvise(
                            e.fds[f],
                            (r.backing + into) as i64,
                            take as i64,
                            libc::POSIX_FADV_WILLNEED,
                        )
                    };
                }
                // SAFETY: dst is valid for `take` bytes.
                unsafe { sys_pread_full(e.fds[f], dst, take, r.backing + into) }.inspect(|g| {
                    DIRECT_BYTES.fetch_add(*g, Relaxed);
                })
            }
            // SAFETY: as above.
            None => unsafe { sys_pread_full(fd, dst, take, pos) }.inspect(|g| {
                FUSE_BYTES.fetch_add(*g, Relaxed);
            }),
        };
        match got {
            Ok(g) => {
                done += g;
                if g < take {
                    break;
                }
            }
            Err(err) if done == 0 => return Err(err),
            Err(_) => break,
        }
        i += 1;
    }
    Ok(done)
}

/// Writes `n` bytes at `off` of a pending tile into its runs, then records them with
/// the daemon (RECORD_WRITE), which checks the range as a write through the mount is
/// checked. `None`: a write past the tile, which goes to FUSE for FUSE's own error.
/// Bytes written but not recorded (an error between) count as never written.
///
/// # Safety
/// `buf` must be valid for `n` bytes of reads.
unsafe fn pwrite_entry(
    e: &Entry,
    buf: *const u8,
    n: usize,
    off: u64,
) -> Option<Result<u64, c_int>> {
    let fd = e.hidden;
    let end = off.checked_add(n as u64)?;
    if end > e.map.size || !plain_writes(fd) {
        return None;
    }
    if n == 0 {
        return Some(Ok(0));
    }
    // Asked first: is the tile still pending, the range inside it? A map lives as long
    // as the descriptor, and the file may have been committed (or the dataset removed)
    // since: its bytes must then not be touched. FUSE's own write checks as late.
    if let Err(err) = record(fd, abi::RECORD_CHECK, off, n as u64) {
        return Some(Err(err));
    }
    let mut done = 0u64;
    let mut i = e.map.find(off);
    while done < n as u64 && i < e.map.runs.len() {
        let r = e.map.runs[i];
        let pos = off + done;
        let into = pos - r.start;
        let take = (r.len - into).min(n as u64 - done).min(WRITE_PIECE);
        let f = r.file?;
        // SAFETY: `buf + done .. buf + done + take` lies inside the caller's buffer.
        let wrote =
            unsafe { sys_pwrite_all(e.fds[f], buf.add(done as usize), take, r.backing + into) }
                .and_then(|()| record(fd, 0, pos, take));
        if let Err(err) = wrote {
            // what was recorded stays written: a short write, as a file system's
            return Some(if done > 0 { Ok(done) } else { Err(err) });
        }
        done += take;
        WRITTEN_BYTES.fetch_add(take, Relaxed);
        if into + take == r.len {
            i += 1;
        }
    }
    Some(Ok(done))
}

/// RECORD_WRITE of `[off, off + len)` on the mount's descriptor: with `RECORD_CHECK`
/// only asked whether the range may be written now, else recorded as written.
fn record(fd: c_int, flags: u32, off: u64, len: u64) -> Result<(), c_int> {
    let mut req = abi::RecordWrite {
        version: abi::ABI_VERSION,
        flags,
        file_offset: off,
        length: len,
        ..Default::default()
    };
    // SAFETY: RECORD_WRITE reads one RecordWrite, which `req` is.
    let r = unsafe {
        libc::ioctl(
            fd,
            abi::RECORD_WRITE as _,
            &mut req as *mut abi::RecordWrite,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(errno())
    }
}

/// Whether writes of this open file description may go direct: not O_APPEND (set
/// after open with F_SETFL) nor O_SYNC/O_DSYNC, whose semantics FUSE keeps.
fn plain_writes(fd: c_int) -> bool {
    // SAFETY: F_GETFL takes no pointer.
    let fl = unsafe { libc::syscall(libc::SYS_fcntl, fd, libc::F_GETFL) } as c_int;
    fl >= 0 && fl & (libc::O_APPEND | libc::O_SYNC | libc::O_DSYNC) == 0
}

/// `write` on a tracked tile: at the kernel's file offset, which it then moves.
///
/// # Safety
/// Every `(ptr, len)` of `iov` must be valid for reads.
unsafe fn write_entry(e: &Entry, iov: &[(*const u8, usize)]) -> Option<ssize_t> {
    let fd = e.hidden;
    let _l = e.offset.try_lock().ok()?;
    let pos = sys_lseek(fd, 0, libc::SEEK_CUR);
    if pos < 0 {
        return None;
    }
    // SAFETY: the caller's iovecs.
    let r = unsafe { pwritev_entry(e, iov, pos as u64) }?;
    if let Ok(n) = r {
        sys_lseek(fd, pos + n as i64, libc::SEEK_SET);
    }
    Some(ret(r))
}

/// # Safety
/// Every `(ptr, len)` of `iov` must be valid for reads.
unsafe fn pwritev_entry(
    e: &Entry,
    iov: &[(*const u8, usize)],
    off: u64,
) -> Option<Result<u64, c_int>> {
    let total = iov
        .iter()
        .try_fold(0u64, |a, &(_, l)| a.checked_add(l as u64))?;
    if off.checked_add(total)? > e.map.size {
        return None;
    }
    let mut at = off;
    for &(p, l) in iov {
        // SAFETY: (p, l) is a buffer of the caller's.
        match unsafe { pwrite_entry(e, p, l, at) }? {
            Ok(n) => at += n,
            Err(err) if at == off => return Some(Err(err)),
            Err(_) => break,
        }
    }
    Some(Ok(at - off))
}

fn ret(r: Result<u64, c_int>) -> ssize_t {
    match r {
        Ok(n) => n as ssize_t,
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

/// `read` on a tracked descriptor: at the kernel's file offset, which it then moves.
unsafe fn read_entry(e: &Entry, iov: &[(*mut u8, usize)]) -> Option<ssize_t> {
    let fd = e.hidden;
    let _l = e.offset.try_lock().ok()?;
    let pos = sys_lseek(fd, 0, libc::SEEK_CUR);
    if pos < 0 {
        return None;
    }
    // SAFETY: the caller's iovecs are valid.
    let r = unsafe { preadv_entry(e, iov, pos as u64) };
    if let Ok(n) = r {
        sys_lseek(fd, pos + n as i64, libc::SEEK_SET);
    }
    Some(ret(r))
}

/// # Safety
/// Every `(ptr, len)` of `iov` must be valid for writes.
unsafe fn preadv_entry(e: &Entry, iov: &[(*mut u8, usize)], off: u64) -> Result<u64, c_int> {
    let mut total = 0u64;
    for &(p, l) in iov {
        // SAFETY: (p, l) is a buffer of the caller's.
        match unsafe { pread_entry(e, p, l, off + total) } {
            Ok(n) => {
                total += n;
                if n < l as u64 {
                    break;
                }
            }
            Err(err) if total == 0 => return Err(err),
            Err(_) => break,
        }
    }
    Ok(total)
}

fn iovs(iov: *const iovec, cnt: c_int) -> Option<Vec<(*mut u8, usize)>> {
    if iov.is_null() || !(0..=1024).contains(&cnt) {
        return None;
    }
    // SAFETY: the caller passes `cnt` iovecs at `iov`.
    let s: &[iovec] = unsafe { std::slice::from_raw_parts(iov, cnt as usize) };
    Some(
        s.iter()
            .map(|v| (v.iov_base.cast::<u8>(), v.iov_len))
            .collect(),
    )
}

mod symbols;
