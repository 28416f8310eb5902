//! The exported symbols: each calls libc's own and, for a descriptor the library
//! tracks, serves or records it (src/preload/lib.rs says how).

// The exported functions keep libc's own contracts; their docs are libc's manual pages.
#![allow(clippy::missing_safety_doc)]

use super::*;
use libc::{c_char, c_int, c_long, c_uint, c_void, iovec, mode_t, off_t, size_t, ssize_t, FILE};

macro_rules! opener {
    ($name:ident, $lit:literal) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
            let fd = match real!($lit, fn(*const c_char, c_int, mode_t) -> c_int) {
                // SAFETY: the caller's arguments, passed on.
                Some(f) => unsafe { f(path, flags, mode) },
                None => missing(),
            };
            track(fd, flags);
            fd
        }
    };
}
// The mode is variadic in C; on the System V x86-64 and AArch64 ABIs it arrives where a
// third integer argument does, and it is passed on unread unless O_CREAT or O_TMPFILE.
opener!(open, "open");
opener!(open64, "open64");

macro_rules! opener_at {
    ($name:ident, $lit:literal) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            dirfd: c_int,
            path: *const c_char,
            flags: c_int,
            mode: mode_t,
        ) -> c_int {
            let fd = match real!($lit, fn(c_int, *const c_char, c_int, mode_t) -> c_int) {
                // SAFETY: the caller's arguments, passed on.
                Some(f) => unsafe { f(dirfd, path, flags, mode) },
                None => missing(),
            };
            track(fd, flags);
            fd
        }
    };
}
opener_at!(openat, "openat");
opener_at!(openat64, "openat64");

macro_rules! opener_2 {
    ($name:ident, $lit:literal) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(path: *const c_char, flags: c_int) -> c_int {
            let fd = match real!($lit, fn(*const c_char, c_int) -> c_int) {
                // SAFETY: the caller's arguments, passed on.
                Some(f) => unsafe { f(path, flags) },
                None => missing(),
            };
            track(fd, flags);
            fd
        }
    };
}
// _FORTIFY_SOURCE's checked variants.
opener_2!(__open_2, "__open_2");
opener_2!(__open64_2, "__open64_2");

macro_rules! fopener {
    ($name:ident, $lit:literal) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(path: *const c_char, mode: *const c_char) -> *mut FILE {
            let fp = match real!($lit, fn(*const c_char, *const c_char) -> *mut FILE) {
                // SAFETY: the caller's arguments, passed on.
                Some(f) => unsafe { f(path, mode) },
                None => std::ptr::null_mut(),
            };
            if !fp.is_null() && !mode.is_null() {
                // SAFETY: fopen succeeded, so `mode` is a C string and `fp` a stream.
                let m = unsafe { std::ffi::CStr::from_ptr(mode) }.to_bytes();
                if m.first() == Some(&b'r') && !m.contains(&b'+') {
                    // SAFETY: `fp` is an open stream.
                    track(unsafe { libc::fileno(fp) }, libc::O_RDONLY);
                }
            }
            fp
        }
    };
}
// glibc's fopen opens with its internal symbol, out of the library's reach.
fopener!(fopen, "fopen");
fopener!(fopen64, "fopen64");

#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    forget(fd);
    match real!("close", fn(c_int) -> c_int) {
        // SAFETY: passed on.
        Some(f) => unsafe { f(fd) },
        None => missing(),
    }
}

#[no_mangle]
pub unsafe extern "C" fn fclose(fp: *mut FILE) -> c_int {
    if !fp.is_null() {
        // SAFETY: the caller's open stream.
        forget(unsafe { libc::fileno(fp) });
    }
    match real!("fclose", fn(*mut FILE) -> c_int) {
        // SAFETY: passed on.
        Some(f) => unsafe { f(fp) },
        None => missing(),
    }
}

#[no_mangle]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    let r = match real!("dup", fn(c_int) -> c_int) {
        // SAFETY: passed on.
        Some(f) => unsafe { f(fd) },
        None => missing(),
    };
    share(fd, r);
    r
}

#[no_mangle]
pub unsafe extern "C" fn dup2(fd: c_int, to: c_int) -> c_int {
    let r = match real!("dup2", fn(c_int, c_int) -> c_int) {
        // SAFETY: passed on.
        Some(f) => unsafe { f(fd, to) },
        None => missing(),
    };
    if r >= 0 && fd != to {
        share(fd, r);
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn dup3(fd: c_int, to: c_int, flags: c_int) -> c_int {
    let r = match real!("dup3", fn(c_int, c_int, c_int) -> c_int) {
        // SAFETY: passed on.
        Some(f) => unsafe { f(fd, to, flags) },
        None => missing(),
    };
    share(fd, r);
    r
}

macro_rules! fcntl_fn {
    ($name:ident, $lit:literal) => {
        /// Only F_DUPFD and F_DUPFD_CLOEXEC matter here (Python's `os.dup` uses the
        /// latter); the third argument is passed on as the integer or pointer it is.
        #[no_mangle]
        pub unsafe extern "C" fn $name(fd: c_int, cmd: c_int, arg: c_long) -> c_int {
            let r = match real!($lit, fn(c_int, c_int, c_long) -> c_int) {
                // SAFETY: passed on.
                Some(f) => unsafe { f(fd, cmd, arg) },
                None => missing(),
            };
            if r >= 0 && (cmd == libc::F_DUPFD || cmd == libc::F_DUPFD_CLOEXEC) {
                share(fd, r);
            }
            r
        }
    };
}
fcntl_fn!(fcntl, "fcntl");
fcntl_fn!(fcntl64, "fcntl64");

#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    if let Some(e) = lookup_read(fd) {
        // SAFETY: the caller's buffer.
        if let Some(r) = unsafe { read_entry(&e, &[(buf.cast(), n)]) } {
            return r;
        }
    }
    match real!("read", fn(c_int, *mut c_void, size_t) -> ssize_t) {
        // SAFETY: passed on.
        Some(f) => unsafe { f(fd, buf, n) },
        None => missing(),
    }
}

macro_rules! pread_fn {
    ($name:ident, $lit:literal) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            fd: c_int,
            buf: *mut c_void,
            n: size_t,
            off: off_t,
        ) -> ssize_t {
            if off >= 0 {
                if let Some(e) = lookup_read(fd) {
                    // SAFETY: the caller's buffer.
                    return ret(unsafe { pread_entry(&e, buf.cast(), n, off as u64) });
                }
            }
            match real!($lit, fn(c_int, *mut c_void, size_t, off_t) -> ssize_t) {
                // SAFETY: passed on.
                Some(f) => unsafe { f(fd, buf, n, off) },
                None => missing(),
            }
        }
    };
}
pread_fn!(pread, "pread");
pread_fn!(pread64, "pread64");

#[no_mangle]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    if let Some((e, v)) = lookup_read(fd).and_then(|e| iovs(iov, cnt).map(|v| (e, v))) {
        // SAFETY: the caller's iovecs.
        if let Some(r) = unsafe { read_entry(&e, &v) } {
            return r;
        }
    }
    match real!("readv", fn(c_int, *const iovec, c_int) -> ssize_t) {
        // SAFETY: passed on.
        Some(f) => unsafe { f(fd, iov, cnt) },
        None => missing(),
    }
}

macro_rules! preadv_fn {
    ($name:ident, $lit:literal) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            fd: c_int,
            iov: *const iovec,
            cnt: c_int,
            off: off_t,
        ) -> ssize_t {
            if off >= 0 {
                if let Some((e, v)) = lookup_read(fd).and_then(|e| iovs(iov, cnt).map(|v| (e, v))) {
                    // SAFETY: the caller's iovecs.
                    return ret(unsafe { preadv_entry(&e, &v, off as u64) });
                }
            }
            match real!($lit, fn(c_int, *const iovec, c_int, off_t) -> ssize_t) {
                // SAFETY: passed on.
                Some(f) => unsafe { f(fd, iov, cnt, off) },
                None => missing(),
            }
        }
    };
}
preadv_fn!(preadv, "preadv");
preadv_fn!(preadv64, "preadv64");

macro_rules! preadv2_fn {
    ($name:ident, $lit:literal) => {
        /// Python's `os.preadv` calls this one. Offset -1 reads at the file offset, as
        /// `readv`; flags (RWF_*) other than none go to libc.
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            fd: c_int,
            iov: *const iovec,
            cnt: c_int,
            off: off_t,
            flags: c_int,
        ) -> ssize_t {
            if flags == 0 && off >= -1 {
                if let Some((e, v)) = lookup_read(fd).and_then(|e| iovs(iov, cnt).map(|v| (e, v))) {
                    if off == -1 {
                        // SAFETY: the caller's iovecs.
                        if let Some(r) = unsafe { read_entry(&e, &v) } {
                            return r;
                        }
                    } else {
                        // SAFETY: the caller's iovecs.
                        return ret(unsafe { preadv_entry(&e, &v, off as u64) });
                    }
                }
            }
            match real!(
                $lit,
                fn(c_int, *const iovec, c_int, off_t, c_int) -> ssize_t
            ) {
                // SAFETY: passed on.
                Some(f) => unsafe { f(fd, iov, cnt, off, flags) },
                None => missing(),
            }
        }
    };
}
preadv2_fn!(preadv2, "preadv2");
preadv2_fn!(preadv64v2, "preadv64v2");

#[cfg(target_env = "gnu")]
extern "C" {
    fn flockfile(fp: *mut FILE);
    fn funlockfile(fp: *mut FILE);
}

/// The first fields of glibc's `struct _IO_FILE` (bits/types/struct_FILE.h, part of
/// its ABI since getc and putc became macros).
#[cfg(target_env = "gnu")]
#[repr(C)]
struct GlibcFile {
    flags: c_int,
    read_ptr: *mut c_char,
    read_end: *mut c_char,
    read_base: *mut c_char,
    write_base: *mut c_char,
    write_ptr: *mut c_char,
    write_end: *mut c_char,
    buf_base: *mut c_char,
    buf_end: *mut c_char,
    save_base: *mut c_char,
    backup_base: *mut c_char,
    save_end: *mut c_char,
    markers: *mut c_void,
    chain: *mut c_void,
    fileno: c_int,
    flags2: c_int,
    old_offset: libc::c_long,
    cur_column: u16,
    vtable_offset: i8,
    shortbuf: [c_char; 1],
    lock: *mut c_void,
    /// The file offset glibc believes the descriptor has (`_IO_pos_BAD`, -1: unknown).
    offset: i64,
}

/// `fread` of a tracked stream whose buffer is empty and was never filled (numpy's
/// `fromfile` reads so): the items come straight from the backing file and the kernel
/// offset moves past them, as glibc's own unbuffered large read would. Any other
/// state, or a read reaching the end of the file, goes to glibc.
#[cfg(target_env = "gnu")]
#[no_mangle]
pub unsafe extern "C" fn fread(ptr: *mut c_void, size: size_t, n: size_t, fp: *mut FILE) -> size_t {
    if TRACKED.load(Relaxed) != 0 && !fp.is_null() {
        // SAFETY: the caller's stream.
        let fd = unsafe { libc::fileno(fp) };
        if let Some(e) = lookup_read(fd) {
            // SAFETY: the caller's stream, locked while its state is read and used.
            unsafe { flockfile(fp) };
            // SAFETY: glibc's FILE starts with GlibcFile's fields.
            let r = unsafe { fread_entry(&e, ptr, size, n, &mut *(fp as *mut GlibcFile)) };
            // SAFETY: locked above.
            unsafe { funlockfile(fp) };
            if let Some(r) = r {
                return r;
            }
        }
    }
    match real!(
        "fread",
        fn(*mut c_void, size_t, size_t, *mut FILE) -> size_t
    ) {
        // SAFETY: passed on.
        Some(f) => unsafe { f(ptr, size, n, fp) },
        None => 0,
    }
}

#[cfg(target_env = "gnu")]
unsafe fn fread_entry(
    e: &Entry,
    ptr: *mut c_void,
    size: size_t,
    n: size_t,
    f: &mut GlibcFile,
) -> Option<size_t> {
    const IN_BACKUP: c_int = 0x100;
    const CURRENTLY_PUTTING: c_int = 0x800;
    let empty = f.read_ptr == f.read_end
        && (f.read_end.is_null() || f.read_end == f.buf_base)
        && f.write_ptr == f.write_base
        && f.flags & (IN_BACKUP | CURRENTLY_PUTTING) == 0;
    let total = size.checked_mul(n)?;
    if !empty || total == 0 {
        return None;
    }
    let fd = e.hidden;
    let _l = e.offset.try_lock().ok()?;
    let pos = sys_lseek(fd, 0, libc::SEEK_CUR);
    if pos < 0 || (pos as u64).checked_add(total as u64)? > e.map.size {
        return None;
    }
    // SAFETY: fread's buffer holds size * n bytes.
    match unsafe { pread_entry(e, ptr.cast(), total, pos as u64) } {
        Ok(got) if got == total as u64 => {
            sys_lseek(fd, pos + total as i64, libc::SEEK_SET);
            // glibc caches the descriptor's offset (ftell, and fseek within the buffer,
            // trust it): the library moved it, so the cache is now unknown.
            f.offset = -1;
            Some(n)
        }
        _ => None,
    }
}

macro_rules! mmap_fn {
    ($name:ident, $lit:literal) => {
        /// A read-only mapping inside one backing run whose offset keeps page alignment
        /// maps the backing file; anything else maps the FUSE file.
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            addr: *mut c_void,
            len: size_t,
            prot: c_int,
            flags: c_int,
            fd: c_int,
            off: off_t,
        ) -> *mut c_void {
            let mut target = (fd, off);
            if prot & libc::PROT_WRITE == 0 && flags & libc::MAP_ANONYMOUS == 0 && off >= 0 {
                if let Some(e) = lookup_read(fd) {
                    if let Some(t) = mmap_target(&e, len as u64, off as u64) {
                        target = t;
                    }
                }
            }
            let r = match real!(
                $lit,
                fn(*mut c_void, size_t, c_int, c_int, c_int, off_t) -> *mut c_void
            ) {
                // SAFETY: the caller's arguments, the file possibly the backing one.
                Some(f) => unsafe { f(addr, len, prot, flags, target.0, target.1) },
                None => libc::MAP_FAILED,
            };
            if target.0 != fd && r != libc::MAP_FAILED {
                MMAPS_DIRECT.fetch_add(1, Relaxed);
            }
            r
        }
    };
}
mmap_fn!(mmap, "mmap");
mmap_fn!(mmap64, "mmap64");

fn mmap_target(e: &Entry, len: u64, off: u64) -> Option<(c_int, off_t)> {
    // SAFETY: sysconf takes no pointers.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64;
    if off >= e.map.size {
        return None;
    }
    let end = off.checked_add(len)?.min(e.map.size);
    let r = e.map.runs[e.map.find(off)];
    let f = r.file?;
    let b = r.backing.checked_add(off - r.start)?;
    (end <= r.start + r.len && b % page == 0).then_some((e.fds[f], b as off_t))
}

/// Copies out of or into a tracked file go through `read`/`write` (cp and cat fall back on
/// EXDEV), which this library serves.
#[no_mangle]
pub unsafe extern "C" fn copy_file_range(
    fd_in: c_int,
    off_in: *mut i64,
    fd_out: c_int,
    off_out: *mut i64,
    len: size_t,
    flags: c_uint,
) -> ssize_t {
    if lookup(fd_in).is_some() {
        set_errno(libc::EXDEV);
        return -1;
    }
    match real!(
        "copy_file_range",
        fn(c_int, *mut i64, c_int, *mut i64, size_t, c_uint) -> ssize_t
    ) {
        // SAFETY: passed on.
        Some(f) => unsafe { f(fd_in, off_in, fd_out, off_out, len, flags) },
        None => missing(),
    }
}

fn iovs_w(iov: *const iovec, cnt: c_int) -> Option<Vec<(*const u8, usize)>> {
    iovs(iov, cnt).map(|v| v.into_iter().map(|(p, l)| (p as *const u8, l)).collect())
}

#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t {
    if let Some(e) = lookup_write(fd) {
        // SAFETY: the caller's buffer.
        if let Some(r) = unsafe { write_entry(&e, &[(buf.cast(), n)]) } {
            return r;
        }
    }
    match real!("write", fn(c_int, *const c_void, size_t) -> ssize_t) {
        // SAFETY: passed on.
        Some(f) => unsafe { f(fd, buf, n) },
        None => missing(),
    }
}

macro_rules! pwrite_fn {
    ($name:ident, $lit:literal) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            fd: c_int,
            buf: *const c_void,
            n: size_t,
            off: off_t,
        ) -> ssize_t {
            if off >= 0 {
                if let Some(e) = lookup_write(fd) {
                    // SAFETY: the caller's buffer.
                    if let Some(r) = unsafe { pwrite_entry(&e, buf.cast(), n, off as u64) } {
                        return ret(r);
                    }
                }
            }
            match real!($lit, fn(c_int, *const c_void, size_t, off_t) -> ssize_t) {
                // SAFETY: passed on.
                Some(f) => unsafe { f(fd, buf, n, off) },
                None => missing(),
            }
        }
    };
}
pwrite_fn!(pwrite, "pwrite");
pwrite_fn!(pwrite64, "pwrite64");

#[no_mangle]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    if let Some((e, v)) = lookup_write(fd).and_then(|e| iovs_w(iov, cnt).map(|v| (e, v))) {
        // SAFETY: the caller's iovecs.
        if let Some(r) = unsafe { write_entry(&e, &v) } {
            return r;
        }
    }
    match real!("writev", fn(c_int, *const iovec, c_int) -> ssize_t) {
        // SAFETY: passed on.
        Some(f) => unsafe { f(fd, iov, cnt) },
        None => missing(),
    }
}

macro_rules! pwritev_fn {
    ($name:ident, $lit:literal) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            fd: c_int,
            iov: *const iovec,
            cnt: c_int,
            off: off_t,
        ) -> ssize_t {
            if off >= 0 {
                if let Some((e, v)) =
                    lookup_write(fd).and_then(|e| iovs_w(iov, cnt).map(|v| (e, v)))
                {
                    // SAFETY: the caller's iovecs.
                    if let Some(r) = unsafe { pwritev_entry(&e, &v, off as u64) } {
                        return ret(r);
                    }
                }
            }
            match real!($lit, fn(c_int, *const iovec, c_int, off_t) -> ssize_t) {
                // SAFETY: passed on.
                Some(f) => unsafe { f(fd, iov, cnt, off) },
                None => missing(),
            }
        }
    };
}
pwritev_fn!(pwritev, "pwritev");
pwritev_fn!(pwritev64, "pwritev64");

macro_rules! pwritev2_fn {
    ($name:ident, $lit:literal) => {
        /// Python's `os.pwritev`; offset -1 writes at the file offset; flags go to libc.
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            fd: c_int,
            iov: *const iovec,
            cnt: c_int,
            off: off_t,
            flags: c_int,
        ) -> ssize_t {
            if flags == 0 && off >= -1 {
                if let Some((e, v)) =
                    lookup_write(fd).and_then(|e| iovs_w(iov, cnt).map(|v| (e, v)))
                {
                    let r = if off == -1 {
                        // SAFETY: the caller's iovecs.
                        unsafe { write_entry(&e, &v) }
                    } else {
                        // SAFETY: the caller's iovecs.
                        unsafe { pwritev_entry(&e, &v, off as u64) }.map(ret)
                    };
                    if let Some(r) = r {
                        return r;
                    }
                }
            }
            match real!(
                $lit,
                fn(c_int, *const iovec, c_int, off_t, c_int) -> ssize_t
            ) {
                // SAFETY: passed on.
                Some(f) => unsafe { f(fd, iov, cnt, off, flags) },
                None => missing(),
            }
        }
    };
}
pwritev2_fn!(pwritev2, "pwritev2");
pwritev2_fn!(pwritev64v2, "pwritev64v2");
