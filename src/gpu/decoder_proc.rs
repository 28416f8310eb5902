//! The decoder process (`h5tilefs gpu-decoder`, started by the daemon: src/gpu/decoder.rs,
//! docs/gpu-decode.md). It serves batches of nvCOMP codecs whose corrupt input is
//! undefined behaviour (Zstd, Deflate): each request names the client's allocation by
//! its IPC handle and brings a memfd image of stored chunks; the process decodes them
//! into device scratch and copies the rows into the client's buffer. A fault here costs
//! this process, not the daemon's CUDA context. After any CUDA error it answers and
//! exits, since an error of the context may be sticky; the daemon starts another.
//!
//! One thread per connection (descriptors 3..3+conns). Lock order: each map alone
//! (`ctxs`, `images`, `handles`), never two at once, none across a decode.

use super::devmem::{bind_primary, copy_rows, cu_ok, open_ipc, Scratch, Src};
use super::nvcomp::{Codec, ImageItem, Nvcomp};
use super::wire::{self, Reply, Request};
use cudarc::driver::sys as cu;
use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

/// How long a connection waits for a batch before giving back its device memory.
const IDLE_RELEASE_MS: i32 = 5_000;

/// Images kept mapped and pinned at most (the daemon keeps 8 and has 8 in flight).
const IMAGES_KEPT: usize = 32;

struct Shared {
    nv: Result<Nvcomp, String>,
    /// Primary context per device ordinal, retained for the process's life.
    ctxs: parking_lot::Mutex<Vec<(i32, usize)>>,
    images: parking_lot::Mutex<HashMap<u64, Arc<Image>>>,
    /// Client allocations opened from their IPC handles, while a batch uses them.
    handles: parking_lot::Mutex<HashMap<[u8; 64], Arc<Opened>>>,
    /// Per device: the kernels of src/gpu/kernels/post.cu (Adler-32, unshuffle), or why
    /// they did not load.
    kernels: parking_lot::Mutex<Vec<(i32, Result<Kernels, String>)>>,
}

/// The PTX of src/gpu/kernels/post.cu (tests/gpu/build_kernels.sh), NUL-terminated.
const POST_PTX: &str = concat!(include_str!("kernels/post.ptx"), "\0");

/// Functions of the post-decode module, loaded in a device's primary context (kept for
/// the process's life).
#[derive(Clone, Copy)]
struct Kernels {
    adler32: usize,
    unshuffle: usize,
}

/// A memfd image mapped and pinned here.
struct Image {
    ptr: usize,
    len: usize,
}

impl Drop for Image {
    fn drop(&mut self) {
        // SAFETY: registered and mapped in `Shared::image`, released once; no batch
        // reads it (the map's Arc was the last).
        unsafe {
            cu::cuMemHostUnregister(self.ptr as *mut std::ffi::c_void);
            libc::munmap(self.ptr as *mut libc::c_void, self.len);
        }
    }
}

/// A client allocation opened from its IPC handle.
struct Opened {
    base: u64,
    /// The allocation's real size (cuMemGetAddressRange).
    size: u64,
    ctx: usize,
}

impl Drop for Opened {
    fn drop(&mut self) {
        // SAFETY: opened in `ctx` by `Shared::open`, closed once after its last batch.
        unsafe {
            cu::cuCtxSetCurrent(self.ctx as cu::CUcontext);
            cu::cuIpcCloseMemHandle(self.base);
        }
    }
}

/// Why a request failed; `fatal` ends the process after the reply.
struct Fail {
    block: Option<u64>,
    why: String,
    fatal: bool,
}

impl Fail {
    fn plain(why: impl Into<String>) -> Fail {
        Fail {
            block: None,
            why: why.into(),
            fatal: false,
        }
    }

    fn cuda(e: crate::error::Error) -> Fail {
        Fail {
            block: None,
            why: e.to_string(),
            fatal: true,
        }
    }
}

/// Serves the daemon on descriptors 3..3+conns until it closes them all; the exit code.
pub fn serve(conns: usize) -> i32 {
    // (cudarc panics at the first call when no libcuda loads: probe first)
    // SAFETY: probing for the shared library has no other effect.
    let nv = if !unsafe { cu::is_culib_present() } {
        Err("no CUDA driver (libcuda.so) on this machine".to_string())
    } else {
        // SAFETY: cuInit is the documented first call.
        match unsafe { cu::cuInit(0) } {
            cu::CUresult::CUDA_SUCCESS => Nvcomp::load(),
            r => Err(format!("cuInit failed: {r:?}")),
        }
    };
    if let Err(why) = &nv {
        tracing::warn!(%why, "GPU decoder process without nvCOMP: every batch is refused");
    }
    let sh = Arc::new(Shared {
        nv,
        ctxs: parking_lot::Mutex::new(Vec::new()),
        images: parking_lot::Mutex::new(HashMap::new()),
        handles: parking_lot::Mutex::new(HashMap::new()),
        kernels: parking_lot::Mutex::new(Vec::new()),
    });
    let workers: Vec<_> = (0..conns)
        .map(|k| {
            // SAFETY: the daemon hands us descriptors 3..3+conns, one socket each
            // (decoder::spawn); each is owned by one thread.
            let sock = unsafe { UnixStream::from_raw_fd(3 + k as i32) };
            let sh = sh.clone();
            std::thread::spawn(move || serve_conn(&sh, sock))
        })
        .collect();
    for w in workers {
        let _ = w.join();
    }
    0
}

fn serve_conn(sh: &Shared, mut sock: UnixStream) {
    // Per device: a stream and the scratch its batches decode into.
    let mut per_dev: Vec<(i32, usize, Scratch)> = Vec::new();
    loop {
        // Idle for a while: the device memory of this connection goes back (its scratch
        // and nvCOMP's tables grow to the largest window and would stay for the
        // process's life).
        let mut p = libc::pollfd {
            fd: sock.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd of a live socket.
        if unsafe { libc::poll(&mut p, 1, IDLE_RELEASE_MS) } == 0 {
            for (_, _, scratch) in per_dev.iter_mut() {
                *scratch = Scratch::default();
            }
            continue;
        }
        let (body, fd) = match wire::recv(&mut sock) {
            Ok(Some(f)) => f,
            _ => return,
        };
        let (reply, fatal) = match batch(sh, &mut per_dev, &body, fd) {
            Ok(()) => (Reply::Done, false),
            Err(f) => {
                tracing::warn!(why = %f.why, block = ?f.block, "GPU decoder batch failed");
                (
                    Reply::Failed {
                        block: f.block,
                        fatal: f.fatal,
                        why: f.why,
                    },
                    f.fatal,
                )
            }
        };
        let sent = wire::send(&mut sock, &reply.encode(), None);
        if fatal {
            // (a CUDA error may have left the context unusable: a new process serves on;
            // _exit: the driver's exit handlers could hang with other threads inside it)
            // SAFETY: ends the process at once, running no handlers.
            unsafe { libc::_exit(3) };
        }
        if sent.is_err() {
            return;
        }
    }
}

fn batch(
    sh: &Shared,
    per_dev: &mut Vec<(i32, usize, Scratch)>,
    body: &[u8],
    fd: Option<OwnedFd>,
) -> Result<(), Fail> {
    let req = Request::decode(body).map_err(Fail::plain)?;
    // (first: a request refused below must not keep retired images mapped and pinned)
    let retired: Vec<Arc<Image>> = {
        let mut imgs = sh.images.lock();
        req.retired.iter().filter_map(|r| imgs.remove(r)).collect()
    };
    drop(retired);
    req.check().map_err(Fail::plain)?;
    let codec = Codec::from_code(req.codec).ok_or_else(|| Fail::plain("unknown codec"))?;
    let nv = sh.nv.as_ref().map_err(|e| Fail::plain(e.clone()))?;
    let ctx = sh.bind(req.device).map_err(Fail::cuda)?;
    let image = sh.image(&req, fd)?;
    let opened = sh.open(&req, ctx)?;
    let k = match per_dev.iter().position(|(d, _, _)| *d == req.device) {
        Some(k) => k,
        None => {
            let mut s: cu::CUstream = std::ptr::null_mut();
            // SAFETY: a stream of the bound context, kept for the thread's life.
            cu_ok(unsafe { cu::cuStreamCreate(&mut s, 1) }, "cuStreamCreate")
                .map_err(Fail::cuda)?;
            per_dev.push((req.device, s as usize, Scratch::default()));
            per_dev.len() - 1
        }
    };
    let (_, stream, scratch) = &mut per_dev[k];
    let stream = *stream as cu::CUstream;
    let result = (|| -> Result<(), Fail> {
        let base = scratch
            .ensure(req.scratch.max(1) as usize, stream)
            .map_err(Fail::cuda)?;
        let items: Vec<ImageItem> = req
            .items
            .iter()
            .map(|it| ImageItem {
                src: it.src as usize..(it.src + it.src_len) as usize,
                dst: base + it.dst,
                len: it.len as usize,
                raw: it.raw,
            })
            .collect();
        // SAFETY: the image is mapped for `len` bytes (>= used, checked) and stays
        // mapped while `image` (an Arc) lives; the daemon does not write it while this
        // request is in flight.
        let bytes =
            unsafe { std::slice::from_raw_parts(image.ptr as *const u8, req.used as usize) };
        nv.decode_image(codec, &mut scratch.arena, bytes, &items, stream)
            .map_err(|e| Fail {
                block: e.block.map(|b| b as u64),
                // (a CUDA error may leave the context unusable; a status or a refused
                // range does not)
                fatal: e.block.is_none() && e.why.starts_with("CUDA"),
                why: e.why,
            })?;
        if !req.posts.is_empty() {
            let k = sh.kernels(req.device).map_err(Fail::plain)?;
            post(k, &req.posts, base, &mut scratch.arena, stream)?;
        }
        for c in &req.copies {
            if c.rows == 0 {
                continue;
            }
            // SAFETY: the rows lie in the scratch (decoded above, on this stream) and in
            // the client's allocation (Request::check, and the allocation's real size
            // checked in `open`); synchronized below.
            unsafe {
                copy_rows(
                    Src::Device(base + c.src),
                    c.src_pitch as usize,
                    opened.base + c.dst,
                    c.pitch as usize,
                    c.width as usize,
                    c.rows as usize,
                    stream,
                )
            }
            .map_err(Fail::cuda)?;
        }
        // SAFETY: the thread's live stream.
        cu_ok(
            unsafe { cu::cuStreamSynchronize(stream) },
            "cuStreamSynchronize",
        )
        .map_err(Fail::cuda)
    })();
    sh.close(&req.handle, opened);
    drop(image);
    if req.image_len > wire::IMAGE_KEPT_BYTES {
        // (the daemon keeps no image this large: unmapped now, not at its next request)
        let gone = sh.images.lock().remove(&req.image_id);
        drop(gone);
    }
    result
}

/// Runs the posts after a batch (on `stream`, which has decoded it): the Adler-32 checks,
/// then the unshuffles; waits for them and fails naming the first chunk whose checksum
/// differs. Scratch offsets become addresses from `base`.
fn post(
    k: Kernels,
    posts: &[wire::Post],
    base: u64,
    arena: &mut super::nvcomp::Arena,
    stream: cu::CUstream,
) -> Result<(), Fail> {
    let n = posts.len();
    let mut table: Vec<u64> = Vec::with_capacity(5 * n);
    for p in posts {
        table.extend([base + p.src, base + p.dst, p.len, p.es, p.want]);
    }
    let got_at = 8 * table.len();
    let mut d = arena.get(3, got_at + 4 * n).map_err(Fail::plain)?;
    // (pageable: the copy returns once the table is staged)
    // SAFETY: the arena's buffer holds the table and the results.
    cu_ok(
        unsafe { cu::cuMemcpyHtoDAsync_v2(d, table.as_ptr().cast(), got_at, stream) },
        "cuMemcpyHtoDAsync",
    )
    .map_err(Fail::cuda)?;
    let mut got_d = d + got_at as u64;
    let launch = |f: usize, grid: (u32, u32), params: &mut [*mut std::ffi::c_void]| {
        // SAFETY: `f` is a kernel of the loaded module whose parameters are the
        // pointers `params` points at (a table of `n` posts of device addresses inside
        // the scratch, checked by Request::check, and room for `n` results).
        cu_ok(
            unsafe {
                cu::cuLaunchKernel(
                    f as cu::CUfunction,
                    grid.0,
                    grid.1,
                    1,
                    256,
                    1,
                    1,
                    0,
                    stream,
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            },
            "cuLaunchKernel",
        )
    };
    let mut ps = [
        (&mut d as *mut u64).cast::<std::ffi::c_void>(),
        (&mut got_d as *mut u64).cast::<std::ffi::c_void>(),
    ];
    launch(k.adler32, (n as u32, 1), &mut ps).map_err(Fail::cuda)?;
    if posts.iter().any(|p| p.es > 0) {
        let mut ps = [(&mut d as *mut u64).cast::<std::ffi::c_void>()];
        launch(k.unshuffle, (64, n as u32), &mut ps).map_err(Fail::cuda)?;
    }
    let mut got = vec![0u32; n];
    // SAFETY: waits for the kernels, then reads back the results written by the first.
    unsafe {
        cu_ok(cu::cuStreamSynchronize(stream), "cuStreamSynchronize").map_err(Fail::cuda)?;
        cu_ok(
            cu::cuMemcpyDtoH_v2(got.as_mut_ptr().cast(), got_d, 4 * n),
            "cuMemcpyDtoH",
        )
        .map_err(Fail::cuda)?;
    }
    for (i, (p, g)) in posts.iter().zip(&got).enumerate() {
        if p.want >> 32 == 0 && u64::from(*g) != p.want {
            return Err(Fail {
                block: Some(wire::POST_BLOCK | i as u64),
                why: format!(
                    "Adler-32 of the decoded bytes is {g:#010x}, the stream says {:#010x}",
                    p.want
                ),
                fatal: false,
            });
        }
    }
    Ok(())
}

impl Shared {
    /// The post-decode kernels of `device` (its context current), loaded once.
    fn kernels(&self, device: i32) -> Result<Kernels, String> {
        let mut ks = self.kernels.lock();
        if let Some((_, k)) = ks.iter().find(|(d, _)| *d == device) {
            return k.clone();
        }
        let loaded = (|| -> Result<Kernels, String> {
            let mut m: cu::CUmodule = std::ptr::null_mut();
            // SAFETY: a NUL-terminated PTX image; the module stays loaded for the
            // process's life (its functions are kept).
            let r = unsafe { cu::cuModuleLoadData(&mut m, POST_PTX.as_ptr().cast()) };
            if r != cu::CUresult::CUDA_SUCCESS {
                return Err(format!("loading the post-decode kernels: {r:?}"));
            }
            let func = |name: &std::ffi::CStr| -> Result<usize, String> {
                let mut f: cu::CUfunction = std::ptr::null_mut();
                // SAFETY: out-pointer; `m` is the module loaded above.
                match unsafe { cu::cuModuleGetFunction(&mut f, m, name.as_ptr()) } {
                    cu::CUresult::CUDA_SUCCESS => Ok(f as usize),
                    r => Err(format!("kernel {name:?}: {r:?}")),
                }
            };
            Ok(Kernels {
                adler32: func(c"h5t_adler32")?,
                unshuffle: func(c"h5t_unshuffle")?,
            })
        })();
        if let Err(why) = &loaded {
            tracing::warn!(%why, device, "no post-decode kernels: such batches are refused");
        }
        ks.push((device, loaded.clone()));
        loaded
    }

    fn bind(&self, device: i32) -> crate::error::Result<usize> {
        bind_primary(&self.ctxs, device)
    }

    /// The request's image, mapped and pinned from its descriptor the first time.
    fn image(&self, req: &Request, fd: Option<OwnedFd>) -> Result<Arc<Image>, Fail> {
        if let Some(i) = self.images.lock().get(&req.image_id) {
            if i.len as u64 >= req.used {
                return Ok(i.clone());
            }
        }
        let fd = fd.ok_or_else(|| Fail::plain("an image without its descriptor"))?;
        let len = req.image_len as usize;
        // SAFETY: fstat on our descriptor into a local.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0
            || (st.st_size as u64) < req.image_len
        {
            return Err(Fail::plain("the image is shorter than announced"));
        }
        // SAFETY: maps `len` bytes of the memfd (checked above); unmapped by Image's Drop.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len.max(1),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(Fail::plain(format!(
                "mapping the image: {}",
                std::io::Error::last_os_error()
            )));
        }
        // SAFETY: the mapping above; registered once, unregistered by Image's Drop.
        let r =
            unsafe { cu::cuMemHostRegister_v2(ptr, len.max(1), cu::CU_MEMHOSTREGISTER_PORTABLE) };
        let img = Arc::new(Image {
            ptr: ptr as usize,
            len,
        });
        cu_ok(r, "cuMemHostRegister").map_err(Fail::cuda)?;
        let mut imgs = self.images.lock();
        if imgs.len() >= IMAGES_KEPT {
            // (the daemon sends the descriptor with every request: one dropped here is
            // mapped again when next used)
            let idle: Vec<u64> = imgs
                .iter()
                .filter(|(_, i)| Arc::strong_count(i) == 1)
                .map(|(k, _)| *k)
                .collect();
            for k in idle {
                imgs.remove(&k);
            }
        }
        imgs.insert(req.image_id, img.clone());
        Ok(img)
    }

    /// The client's allocation, opened from its handle (once while batches use it).
    fn open(&self, req: &Request, ctx: usize) -> Result<Arc<Opened>, Fail> {
        let too_small = |size: u64| {
            Fail::plain(format!(
                "the client's allocation is {size} bytes, not the {} registered",
                req.alloc_size
            ))
        };
        let mut hs = self.handles.lock();
        if let Some(o) = hs.get(&req.handle) {
            // (every request's claim checked, not only the first one's)
            if o.size < req.alloc_size {
                return Err(too_small(o.size));
            }
            return Ok(o.clone());
        }
        // SAFETY: closed by Opened's Drop.
        let base = unsafe { open_ipc(&req.handle) }
            .map_err(|r| Fail::plain(format!("cuIpcOpenMemHandle: {r:?}")))?;
        let (mut start, mut size) = (0u64, 0usize);
        // SAFETY: out-pointers to locals; `base` is a live mapping.
        let r = unsafe { cu::cuMemGetAddressRange_v2(&mut start, &mut size, base) };
        let size = if r == cu::CUresult::CUDA_SUCCESS && start == base {
            size as u64
        } else {
            0
        };
        // (closed by its Drop if refused below)
        let o = Arc::new(Opened { base, size, ctx });
        if size < req.alloc_size {
            return Err(too_small(size));
        }
        hs.insert(req.handle, o.clone());
        Ok(o)
    }

    /// A batch is done with `o`: the last one closes the handle.
    fn close(&self, handle: &[u8; 64], o: Arc<Opened>) {
        let last = {
            let mut hs = self.handles.lock();
            drop(o);
            match hs.get(handle) {
                Some(x) if Arc::strong_count(x) == 1 => hs.remove(handle),
                _ => None,
            }
        };
        drop(last);
    }
}
