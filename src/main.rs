//! The `h5tilefs` command: mount and unmount.

use clap::{Parser, Subcommand};
use h5tilefs::fs::{Fs, FsOptions};
use h5tilefs::fuse::FuseFs;
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

mod filecli;
mod logsink;
mod runcli;
mod status;
mod unmount;

#[derive(Parser)]
#[command(
    name = "h5tilefs",
    version,
    about = "Mount a directory of HDF5 files so every dataset reads as plain files",
    long_about = "Mount a directory of HDF5 files so every dataset reads as plain files.\n\n\
    Each HDF5 file appears as a directory, groups as directories, and each dataset as a\n\
    directory with meta.json, data (all elements, C order), tiles/I.J.K (one file per tile)\n\
    and slice/SEL (any NumPy basic-slicing selection, e.g. 'slice/100:200,::2').\n\
    See docs/namespace.md. Logs: RUST_LOG=h5tilefs=debug."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Mount BACKING_DIR at MOUNTPOINT. Returns once the mount is live (exit 0), or
    /// prints why it failed (exit 1).
    Mount(MountArgs),
    /// Unmount MOUNTPOINT (fusermount3 -u, falling back to umount).
    Umount { mountpoint: PathBuf },
    /// Run CMD with the direct data path: files of h5tilefs mounts that it opens
    /// read-only, and whose bytes are plain backing bytes, are read from the backing
    /// files themselves (LD_PRELOAD of libh5tilefs_preload.so; docs/direct.md).
    /// H5TILEFS_DIRECT=0 runs CMD unchanged.
    Run {
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        cmd: Vec<std::ffi::OsString>,
    },
    /// Commit FILE (an HDF5 file's directory in a mount, e.g. MNT/run/out.h5): writes
    /// its .commit and waits, showing progress on a terminal. Exit 0 committed; 3
    /// refused, tiles missing (listed per dataset); 4 another commit of FILE runs; 5
    /// the backing file system failed (the old file is untouched); 1 not a file of a
    /// mount; 2 daemon gone.
    Commit {
        file: PathBuf,
        /// Print the commit's result as JSON (`last_commit` of .status).
        #[arg(long)]
        json: bool,
    },
    /// Health check of the daemon serving MOUNTPOINT: exit 0 when it answers, 1 when
    /// MOUNTPOINT is not an h5tilefs mount, 2 when the daemon is gone, hung or stuck
    /// (unmount and mount again), 3 when the daemon is alive but its backing directory
    /// is unreachable: removed, unmounted from under it, or hanging (restore or remount
    /// the backing file system; leave h5tilefs mounted).
    ///
    /// With an HDF5 file's directory instead (MNT/run/out.h5): its pending datasets
    /// with tiles written and missing, as a table (--json: .status as is); when the
    /// file cannot be read, the mount's check above says why (exit 2 or 3).
    Status {
        mountpoint: PathBuf,
        /// Print the daemon's full stats JSON instead of the summary.
        #[arg(long)]
        json: bool,
        /// Seconds to wait for the daemon's answer.
        #[arg(long, default_value_t = 5)]
        timeout: u64,
        /// A request running longer than this many seconds marks the daemon stuck
        /// (exit 2): for example a thread spinning inside the HDF5 library.
        #[arg(long, default_value_t = 60)]
        stuck_after: u64,
    },
    /// The GPU decoder process a daemon starts for itself (docs/gpu-decode.md): serves
    /// the daemon on descriptors 3..3+CONNS; not for users.
    #[command(hide = true)]
    GpuDecoder {
        #[arg(long)]
        conns: usize,
    },
}

#[derive(clap::Args)]
struct MountArgs {
    /// Directory holding the HDF5 files (and subdirectories) to present.
    backing_dir: PathBuf,
    /// Empty directory to mount on.
    mountpoint: PathBuf,
    /// Stay in the foreground (logs to stderr) instead of detaching.
    #[arg(long)]
    foreground: bool,
    /// Mount read-only (the kernel refuses every write).
    #[arg(long)]
    read_only: bool,
    /// Let other users access the mount (needs user_allow_other in /etc/fuse.conf when
    /// not root). Permissions still mirror the backing files (default_permissions).
    #[arg(long)]
    allow_other: bool,
    /// FUSE worker threads [default: 2 x CPUs, at least 8, at most 32].
    #[arg(long)]
    threads: Option<usize>,
    /// Target size of a tile of a contiguous dataset (whole rows), in bytes; accepts
    /// K/M/G suffixes.
    #[arg(long, default_value = "64M", value_parser = parse_bytes)]
    tile_bytes: u64,
    /// Memory for decoded (filtered) chunks, in bytes; accepts K/M/G suffixes.
    #[arg(long, default_value = "256M", value_parser = parse_bytes)]
    cache_bytes: u64,
    /// GPU support: `auto` loads CUDA and cuFile at the first GPU request (READ_TO_GPU
    /// ioctl) when present; `preload` loads them in the background at mount, so the
    /// first request does not wait for it (each device's context then holds some GPU
    /// memory for the daemon's life); `off` never touches them.
    #[arg(long, value_enum, default_value = "auto")]
    gpu: h5tilefs::gpu::GpuMode,
    /// Threads that read one large READ_TO_GPU request as parallel cuFile pieces.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=64))]
    gpu_io_threads: u16,
    /// Compressed chunks of fewer bytes are encoded by the commit, packed one after
    /// another, instead of by their writers' daemons into fixed slots, whose unused
    /// tails are freed only in whole file-system blocks; accepts K/M/G suffixes; 0:
    /// writers encode every chunk.
    #[arg(long, default_value = "64K", value_parser = parse_bytes_or_zero)]
    writer_encode_min: u64,
    /// Kernel readahead for the mount, in KiB (set through sysfs when permitted).
    #[arg(long, default_value_t = 4096)]
    readahead_kb: u32,
    /// Write logs to this file (appended; rotated to FILE.1 past 64 MiB). Without it a
    /// detached daemon logs to the journal when systemd started it, else to
    /// $XDG_STATE_HOME/h5tilefs/<mount point>.log (~/.local/state/... by default);
    /// `h5tilefs status` says where.
    #[arg(long)]
    log_file: Option<PathBuf>,
    /// Mount over a directory that is not empty (its files are hidden while mounted).
    #[arg(long)]
    nonempty: bool,
    /// On SIGTERM/SIGINT: seconds to keep serving files still open after the mount is
    /// detached, before exiting anyway.
    #[arg(long, default_value_t = 30)]
    shutdown_grace: u64,
    /// Mount options, comma separated, as fstab and `mount -t fuse.h5tilefs` pass them:
    /// ro, allow_other, threads=N, tile_bytes=SIZE, cache_bytes=SIZE, log_file=PATH,
    /// gpu_io_threads=N, writer_encode_min=SIZE, gpu=MODE, nonempty.
    /// Generic options (rw, noauto, _netdev, user, x-systemd.*, ...) are accepted and
    /// ignored; any other is refused by name.
    #[arg(short = 'o', value_delimiter = ',')]
    options: Vec<String>,
}

/// Folds `-o` options into the flags they stand for.
fn apply_mount_options(args: &mut MountArgs) -> Result<(), String> {
    let mut unknown = Vec::new();
    for o in std::mem::take(&mut args.options) {
        let (k, v) = match o.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (o.as_str(), None),
        };
        match (k, v) {
            ("ro", None) => args.read_only = true,
            ("allow_other", None) => args.allow_other = true,
            ("gpu_io_threads", Some(v)) => {
                args.gpu_io_threads = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=64).contains(n))
                    .ok_or_else(|| format!("bad gpu_io_threads={v} (1 to 64)"))?
            }
            ("threads", Some(v)) => {
                args.threads = Some(v.parse().map_err(|_| format!("bad threads={v}"))?)
            }
            ("gpu", Some(v)) => {
                args.gpu = <h5tilefs::gpu::GpuMode as clap::ValueEnum>::from_str(v, true)
                    .map_err(|_| format!("bad gpu={v} (auto, preload or off)"))?
            }
            ("tile_bytes", Some(v)) => args.tile_bytes = parse_bytes(v)?,
            ("cache_bytes", Some(v)) => args.cache_bytes = parse_bytes(v)?,
            ("writer_encode_min", Some(v)) => args.writer_encode_min = parse_bytes_or_zero(v)?,
            ("log_file", Some(v)) => args.log_file = Some(PathBuf::from(v)),
            ("nonempty", None) => args.nonempty = true,
            (k, _) if is_generic_option(k) => {}
            (k, v) => match (KNOWN_WITH_VALUE.contains(&k), KNOWN_FLAGS.contains(&k), v) {
                (true, _, None) => {
                    return Err(format!("mount option `{k}` needs a value ({k}=...)"))
                }
                (_, true, Some(_)) => return Err(format!("mount option `{k}` takes no value")),
                _ => unknown.push(format!("`{o}`")),
            },
        }
    }
    if !unknown.is_empty() {
        return Err(format!(
            "unknown mount option{} {} (h5tilefs takes: ro, allow_other, threads=N, \
             tile_bytes=SIZE, cache_bytes=SIZE, log_file=PATH, gpu=auto|preload|off, \
             gpu_io_threads=N, writer_encode_min=SIZE, nonempty)",
            if unknown.len() > 1 { "s" } else { "" },
            unknown.join(", ")
        ));
    }
    Ok(())
}

const KNOWN_WITH_VALUE: &[&str] = &[
    "threads",
    "tile_bytes",
    "cache_bytes",
    "log_file",
    "gpu",
    "gpu_io_threads",
    "writer_encode_min",
];
const KNOWN_FLAGS: &[&str] = &["ro", "allow_other", "nonempty"];

/// Options mount(8), fstab and systemd pass to every file system, which say nothing
/// to h5tilefs itself.
fn is_generic_option(k: &str) -> bool {
    const GENERIC: &[&str] = &[
        "rw",
        "defaults",
        "auto",
        "noauto",
        "_netdev",
        "nofail",
        "user",
        "users",
        "nouser",
        "owner",
        "group",
        "exec",
        "noexec",
        "suid",
        "nosuid",
        "dev",
        "nodev",
        "sync",
        "async",
        "atime",
        "noatime",
        "relatime",
        "norelatime",
        "strictatime",
        "nostrictatime",
        "lazytime",
        "nolazytime",
        "diratime",
        "nodiratime",
        "default_permissions",
        "fsname",
        "subtype",
        "comment",
    ];
    GENERIC.contains(&k) || k.starts_with("x-")
}

fn parse_bytes(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_uppercase() {
                'K' => 1u64 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => return Err(format!("unknown size suffix in {s:?}")),
            };
            (&s[..i], m)
        }
        _ => (s, 1),
    };
    let n: u64 = num.parse().map_err(|_| format!("not a size: {s:?}"))?;
    n.checked_mul(mult)
        .filter(|&v| v > 0)
        .ok_or_else(|| format!("size out of range: {s:?}"))
}

/// A size as [`parse_bytes`] reads it, where 0 is allowed (it turns a feature off).
fn parse_bytes_or_zero(s: &str) -> Result<u64, String> {
    if s.trim() == "0" {
        return Ok(0);
    }
    parse_bytes(s)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Mount(args) => match mount(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(msg) => {
                eprintln!("h5tilefs: {msg}");
                ExitCode::FAILURE
            }
        },
        Cmd::Run { cmd } => runcli::run_direct(&cmd),
        Cmd::Umount { mountpoint } => match unmount::umount(&mountpoint) {
            Ok(()) => ExitCode::SUCCESS,
            Err(msg) => {
                eprintln!("h5tilefs: {msg}");
                ExitCode::FAILURE
            }
        },
        Cmd::Status {
            mountpoint,
            json,
            timeout,
            stuck_after,
        } => {
            if filecli::names_a_file(&mountpoint) {
                ExitCode::from(filecli::status(&mountpoint, json, timeout))
            } else {
                ExitCode::from(status::run(&mountpoint, json, timeout, stuck_after))
            }
        }
        Cmd::Commit { file, json } => ExitCode::from(filecli::commit(&file, json)),
        Cmd::GpuDecoder { conns } => {
            init_logging(&LogTo::Stderr("standard error"));
            ExitCode::from(h5tilefs::gpu::decoder_process(conns.min(64)) as u8)
        }
    }
}

/// `--gpu preload`: CUDA and cuFile loaded on a thread of their own while the mount
/// already serves requests (a GPU request meanwhile waits for the same load).
fn preload_gpu(core: &Arc<Fs>) {
    if core.mount.opts.gpu == h5tilefs::gpu::GpuMode::Preload {
        let core = core.clone();
        std::thread::spawn(move || core.gpu.dev.preload());
    }
}

/// True when `mnt` is already a mount point (per /proc/self/mountinfo).
fn is_mounted(mnt: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let target = mnt.to_string_lossy().replace(' ', "\\040");
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|m| m == target)
}

/// Raises the kernel readahead of our mount's backing device info (sysfs), so buffered
/// reads arrive as 1 MiB requests instead of 128 KiB. Read from mountinfo: a stat of
/// the mount point would wait on our own, not yet running, request loop.
fn tune_readahead(mnt: &Path, kb: u32) {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let target = mnt.to_string_lossy().replace(' ', "\\040");
    let Some(dev) = info.lines().rev().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        (f.get(4) == Some(&target.as_str())).then(|| f.get(2).map(|s| s.to_string()))?
    }) else {
        return;
    };
    let path = format!("/sys/class/bdi/{dev}/read_ahead_kb");
    match std::fs::write(&path, kb.to_string()) {
        Ok(()) => tracing::debug!(%path, kb, "readahead set"),
        Err(e) => tracing::debug!(%path, error = %e, "readahead left at the kernel default"),
    }
}

/// Closes every descriptor above stderr that the caller handed on. The daemon lives
/// for the mount's life: an inherited descriptor of an HDF5 file would keep libhdf5's
/// `flock` of it (held per open file, not per process) until the unmount, and the
/// caller's next open of that file for writing would fail with "unable to lock file"
/// (a Python program that has an h5py file open and mounts with `os.system`). Nothing
/// of ours is open yet.
fn close_inherited_fds() {
    // SAFETY: close_range takes plain integers and only closes descriptors of this
    // process; none above 2 belongs to anything of ours at this point.
    let rc = unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) };
    if rc == 0 {
        return;
    }
    // Kernels before 5.9: close what /proc lists (collected first: the listing holds a
    // descriptor of its own while it is read).
    let Ok(rd) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    let fds: Vec<i32> = rd
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|&fd| fd > 2)
        .collect();
    for fd in fds {
        // SAFETY: as above; closing the listing's own, already closed, descriptor
        // fails with EBADF and changes nothing.
        unsafe { libc::close(fd) };
    }
}

/// Everything that can be checked before forking, with messages a user can act on.
fn preflight(args: &MountArgs) -> Result<(PathBuf, PathBuf), String> {
    let b = &args.backing_dir;
    match std::fs::metadata(b) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(format!("backing dir {} is not a directory", b.display())),
        Err(e) => return Err(format!("backing dir {}: {e}", b.display())),
    }
    let mnt = args
        .mountpoint
        .canonicalize()
        .map_err(|e| format!("mount point {}: {e}", args.mountpoint.display()))?;
    if !mnt.is_dir() {
        return Err(format!("mount point {} is not a directory", mnt.display()));
    }
    if is_mounted(&mnt) {
        return Err(format!(
            "mount point {} is busy (already mounted); unmount it first",
            mnt.display()
        ));
    }
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        return Err(format!(
            "/dev/fuse: {e} (is the fuse module loaded and /dev/fuse accessible?)"
        ));
    }
    let backing = b
        .canonicalize()
        .map_err(|e| format!("backing dir {}: {e}", b.display()))?;
    if mnt.starts_with(&backing) {
        return Err(format!(
            "mount point {} is inside the backing dir {}: the mount would show itself \
             inside itself; mount it elsewhere",
            mnt.display(),
            backing.display()
        ));
    }
    if backing.starts_with(&mnt) {
        return Err(format!(
            "backing dir {} is inside the mount point {}: the mount would hide it; \
             mount it elsewhere",
            backing.display(),
            mnt.display()
        ));
    }
    if !args.nonempty {
        let entry = std::fs::read_dir(&mnt)
            .map_err(|e| format!("mount point {}: {e}", mnt.display()))?
            .next();
        if let Some(Ok(e)) = entry {
            return Err(format!(
                "mount point {} is not empty (it holds {:?}, which the mount would hide); \
                 use an empty directory, or --nonempty (-o nonempty) to mount over it",
                mnt.display(),
                e.file_name()
            ));
        }
    }
    Ok((backing, mnt))
}

/// Where the daemon's logs go.
enum LogTo {
    /// A capped file (`--log-file`, or the default one of a detached daemon).
    File(PathBuf),
    /// Standard error: the terminal of a foreground daemon, or systemd's journal.
    Stderr(&'static str),
}

/// Where a daemon mounted at `mnt` logs (`detached`: after it leaves the terminal).
fn log_destination(log_file: Option<&Path>, mnt: &Path, detached: bool) -> LogTo {
    match log_file {
        Some(p) => LogTo::File(std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())),
        None if !detached => LogTo::Stderr("standard error"),
        None if logsink::stderr_is_journal() => LogTo::Stderr("the systemd journal"),
        None => LogTo::File(logsink::default_path(mnt)),
    }
}

/// Starts logging to `to`; returns where the logs go, as `h5tilefs status` shows it.
fn init_logging(to: &LogTo) -> String {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("h5tilefs=info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match to {
        LogTo::File(p) => match logsink::CappedLog::open(p, logsink::cap_from_env()) {
            Ok(log) => {
                builder.with_ansi(false).with_writer(Arc::new(log)).init();
                p.display().to_string()
            }
            Err(e) => format!("nowhere ({}: {e})", p.display()),
        },
        LogTo::Stderr(what) => {
            builder.with_writer(std::io::stderr).init();
            what.to_string()
        }
    }
}

fn mount(args: MountArgs) -> Result<(), String> {
    close_inherited_fds();
    let mut args = args;
    apply_mount_options(&mut args)?;
    let (backing, mnt) = preflight(&args)?;
    let read_only = args.read_only;
    let allow_other = args.allow_other;
    let threads = args.threads.unwrap_or_else(|| {
        let n = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2);
        (2 * n).clamp(8, 32)
    });
    let readahead_kb = args.readahead_kb;
    let opts = FsOptions {
        tile_bytes: args.tile_bytes,
        cache_bytes: args.cache_bytes,
        read_only,
        allow_other,
        threads,
        gpu: args.gpu,
        gpu_io_threads: args.gpu_io_threads.into(),
        engine: h5tilefs::engine::EngineConfig::from_env(),
        writer_encode_min: args.writer_encode_min,
        log: None,
    };
    if args.foreground {
        let mut opts = opts;
        opts.log = Some(init_logging(&log_destination(
            args.log_file.as_deref(),
            &mnt,
            false,
        )));
        let (mut session, core) = start(&backing, &mnt, opts)?;
        tune_readahead(&mnt, readahead_kb);
        tracing::info!(mountpoint = %mnt.display(), "mounted");
        preload_gpu(&core);
        shutdown_on_signal(core, session.unmount_callable(), &mnt, args.shutdown_grace);
        let r = session.run().map_err(|e| format!("FUSE session: {e}"));
        h5tilefs::pending::wait_trash(std::time::Duration::from_secs(10));
        return r;
    }
    // Fork before any thread or HDF5 state exists; the child reports readiness on a pipe.
    let mut fds = [0i32; 2];
    // SAFETY: pipe writes two fds into the array we own.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return Err(format!("pipe: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: both fds were just created and are owned here only.
    let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: single-threaded at this point, so fork is sound.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(format!("fork: {}", std::io::Error::last_os_error()));
    }
    if pid > 0 {
        drop(wr);
        let mut msg = String::new();
        let _ = std::fs::File::from(rd).read_to_string(&mut msg);
        return match msg.strip_prefix("OK") {
            Some(_) => Ok(()),
            None if msg.is_empty() => Err("the daemon exited before the mount was live".into()),
            None => Err(msg),
        };
    }
    drop(rd);
    let mut wr = std::fs::File::from(wr);
    // (decided before standard error is let go: the journal keeps it)
    let log_to = log_destination(args.log_file.as_deref(), &mnt, true);
    let keep_stderr = matches!(log_to, LogTo::Stderr(_));
    // SAFETY: setsid and the dup2 calls only touch this process's session and fds.
    unsafe {
        libc::setsid();
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if null >= 0 {
            libc::dup2(null, 0);
            libc::dup2(null, 1);
            if !keep_stderr {
                libc::dup2(null, 2);
            }
            if null > 2 {
                libc::close(null);
            }
        }
    }
    // HDF5 resolves some relative names (virtual sources) against the working
    // directory: keep that inside the backing directory.
    let _ = std::env::set_current_dir(&backing);
    let mut opts = opts;
    opts.log = Some(init_logging(&log_to));
    match start(&backing, &mnt, opts) {
        Ok((mut session, core)) => {
            tune_readahead(&mnt, readahead_kb);
            tracing::info!(mountpoint = %mnt.display(), "mounted");
            preload_gpu(&core);
            shutdown_on_signal(core, session.unmount_callable(), &mnt, args.shutdown_grace);
            let _ = wr.write_all(b"OK");
            drop(wr);
            if let Err(e) = session.run() {
                tracing::error!(error = %e, "FUSE session ended with an error");
                std::process::exit(1);
            }
            tracing::info!("unmounted");
            h5tilefs::pending::wait_trash(std::time::Duration::from_secs(10));
            std::process::exit(0);
        }
        Err(msg) => {
            tracing::error!("{msg}");
            let _ = wr.write_all(msg.as_bytes());
            std::process::exit(1);
        }
    }
}

/// Lifts the soft open-file limit to the hard one: many clients, tiles and backing
/// files can be open at once.
fn raise_nofile() {
    // SAFETY: getrlimit/setrlimit on a struct we own.
    unsafe {
        let mut r: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < r.rlim_max {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

/// The signals that start a graceful shutdown.
fn shutdown_signals() -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset initialise and fill a set we own.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        set
    }
}

/// Graceful shutdown on SIGTERM/SIGINT: flush the backing file system (tile bytes and
/// range logs: pending state is already on disk, this makes it durable), unmount, and
/// let requests in flight finish. A busy mount is detached instead: new opens fail,
/// files still open keep being served until closed or `grace` seconds pass.
fn shutdown_on_signal(
    core: Arc<Fs>,
    mut unmounter: fuser::SessionUnmounter,
    mnt: &Path,
    grace: u64,
) {
    let mnt = mnt.to_path_buf();
    let spawned = std::thread::Builder::new()
        .name("shutdown".into())
        .spawn(move || {
            let set = shutdown_signals();
            let mut sig = 0;
            // SAFETY: sigwait on a set that every thread blocks (see `start`).
            if unsafe { libc::sigwait(&set, &mut sig) } != 0 {
                return;
            }
            tracing::info!(signal = sig, "shutting down: syncing and unmounting");
            core.writes.draining
                .store(true, std::sync::atomic::Ordering::Relaxed);
            if let Err(e) = core.sync_backing() {
                tracing::warn!("{e}");
            }
            if !is_mounted(&mnt) {
                // Unmounted here already (`h5tilefs umount` stops a daemon that a copy
                // of the mount in another mount namespace keeps alive): nothing is
                // left to unmount or to wait for; the copies lose the connection.
                tracing::info!("the mount is gone from this namespace; exiting");
                std::process::exit(0);
            }
            match unmounter.unmount() {
                Ok(()) => tracing::info!("unmounted"),
                Err(e) => {
                    tracing::info!(error = %e, "mount busy: detaching, open files are still served");
                    let c = std::ffi::CString::new(mnt.as_os_str().as_encoded_bytes())
                        .unwrap_or_default();
                    // SAFETY: umount2 on a NUL-terminated path we own.
                    let lazy_ok = unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0;
                    if !lazy_ok {
                        let _ = std::process::Command::new("fusermount3")
                            .args(["-u", "-z"])
                            .arg(&mnt)
                            .status();
                    }
                }
            }
            // The session loop returns once the kernel drops the connection; if open
            // files keep it alive past the grace period, leave anyway (state is on disk).
            std::thread::sleep(std::time::Duration::from_secs(grace));
            let _ = core.sync_backing();
            tracing::warn!(
                open_handles = core.open_handles(),
                "grace period over with files still open; exiting"
            );
            std::process::exit(0);
        });
    if let Err(e) = spawned {
        tracing::warn!("no shutdown thread ({e}): SIGTERM will not unmount cleanly");
    }
}

fn start(
    backing: &Path,
    mnt: &Path,
    opts: FsOptions,
) -> Result<(fuser::Session<FuseFs>, Arc<Fs>), String> {
    // Block the shutdown signals before any thread exists, so that only the thread in
    // `shutdown_on_signal` receives them (sigwait).
    let set = shutdown_signals();
    // SAFETY: changes this thread's mask; threads spawned later inherit it.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    raise_nofile();
    // A panic is a bug; make sure it reaches the log, not only a closed stderr.
    std::panic::set_hook(Box::new(|info| {
        let bt = std::backtrace::Backtrace::force_capture();
        tracing::error!("panic: {info}\n{bt}");
        eprintln!("h5tilefs panic: {info}\n{bt}");
    }));
    // Writers (h5py, other daemons) may hold the files open; HDF5's advisory locks would
    // make them unreadable to us.
    // SAFETY: called before any thread is spawned.
    unsafe { std::env::set_var("HDF5_USE_FILE_LOCKING", "FALSE") };
    // libhdf5 decodes the filters we decode from the first read on (docs/namespace.md).
    // After the variable above: this opens libhdf5, which reads it then.
    let ours = h5tilefs::h5::zfilters::register();
    tracing::info!(ids = ?ours, "built-in decoders registered with libhdf5");
    h5tilefs::decode::fault::arm_from_env();
    let threads = opts.threads;
    let read_only = opts.read_only;
    let allow_other = opts.allow_other;
    let core = Fs::new(backing, opts).map_err(|e| e.to_string())?;
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::FSName(format!("h5tilefs:{}", core.mount.ns.root.display())),
        fuser::MountOption::Subtype("h5tilefs".into()),
        fuser::MountOption::DefaultPermissions,
        fuser::MountOption::NoAtime,
        fuser::MountOption::NoDev,
        fuser::MountOption::NoSuid,
    ];
    if read_only {
        config.mount_options.push(fuser::MountOption::RO);
    }
    if allow_other {
        config.acl = fuser::SessionACL::All;
    }
    config.n_threads = Some(threads);
    config.clone_fd = true;
    let core = Arc::new(core);
    let fs = FuseFs::new(core.clone());
    let session = fuser::Session::new(fs, mnt, &config)
        .map_err(|e| format!("mounting {}: {e}", mnt.display()))?;
    // Inodes of replaced backing versions are invalidated in the kernel through this.
    let inv = h5tilefs::fuse::invalidator(session.notifier())
        .map_err(|e| format!("starting the kernel notification thread: {e}"))?;
    core.set_invalidator(inv);
    Ok((session, core))
}
