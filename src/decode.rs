//! The decode path: cells whose bytes cannot be read verbatim (filtered chunks,
//! compact storage, virtual mappings HDF5 must resolve), their decoders and a
//! byte-capped cache of decoded cells.

use crate::codecs;
use crate::error::{Error, ModelError, Result};
use crate::extent::{BackingFile, CellKey, CellRef, CellSource};
use crate::geometry::unravel;
use crate::h5::{self, ChunkLoc, FilterInfo};
use dashmap::DashMap;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

static NEXT_UID: AtomicU64 = AtomicU64::new(1);

/// A fresh process-unique id for a cell source.
pub fn next_uid() -> u64 {
    NEXT_UID.fetch_add(1, Ordering::Relaxed)
}

/// Decoded cells, least recently used evicted first once `cap` bytes are held.
///
/// A cell is decoded once however many readers want it: the first claims it (a
/// `Loading` slot), later ones wait on that slot. The cells one request needs are
/// decoded in parallel on a pool of `available_parallelism` threads ([`Self::warm`]),
/// and a sequential reader's next cells are decoded ahead of it ([`Self::prefetch`]).
/// Lock order: the cache lock, then a slot's lock; neither is held across decoding.
pub struct CellCache {
    cap: u64,
    inner: Mutex<CacheInner>,
    pool: WorkerPool,
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub prefetched: AtomicU64,
    /// Cells dropped because a sequential reader had passed them (`release`).
    pub released: AtomicU64,
}

/// A decoded cell, or the errno and message of why it could not be decoded.
type Decoded = std::result::Result<Arc<Vec<u8>>, (i32, String)>;

/// A cell being decoded: waiters sleep on `done` until `result` is set.
#[derive(Default)]
struct Loading {
    result: Mutex<Option<Decoded>>,
    done: parking_lot::Condvar,
}

impl Loading {
    fn wait(&self) -> Result<Arc<Vec<u8>>> {
        let mut g = self.result.lock();
        while g.is_none() {
            self.done.wait(&mut g);
        }
        match g.as_ref() {
            Some(Ok(d)) => Ok(d.clone()),
            Some(Err((errno, m))) => Err(Error::new(*errno, m.clone())),
            None => Err(Error::io("cell decode vanished")),
        }
    }
}

enum Slot {
    Ready(Arc<Vec<u8>>, u64),
    Loading(Arc<Loading>),
}

/// (source uid, cell index) -> slot.
type CellMap = HashMap<CellKey, Slot>;

#[derive(Default)]
struct CacheInner {
    map: CellMap,
    /// Ready cells by last use (tick -> key): eviction takes the first, in O(log n)
    /// under the lock (it scanned the whole map per insert before).
    lru: std::collections::BTreeMap<u64, CellKey>,
    bytes: u64,
    tick: u64,
}

impl CacheInner {
    /// Removes cell `key` if it is decoded (a cell still loading stays), with its LRU
    /// entry and its bytes; returns it so the caller frees it outside the lock.
    fn remove_ready(&mut self, key: &CellKey) -> Option<Arc<Vec<u8>>> {
        if !matches!(self.map.get(key), Some(Slot::Ready(..))) {
            return None;
        }
        let Some(Slot::Ready(v, used)) = self.map.remove(key) else {
            return None;
        };
        self.lru.remove(&used);
        self.bytes -= v.len() as u64;
        Some(v)
    }
}

/// What a reader found for one cell.
enum Claim {
    Hit(Arc<Vec<u8>>),
    Wait(Arc<Loading>),
    Mine(Arc<Loading>),
}

pub type Job = Box<dyn FnOnce() + Send>;

/// Worker threads fed from one queue, started on first use; `queued` bounds prefetch
/// work. The decode pool is one; the view read-ahead has its own
/// (`readahead::view_background`).
pub struct WorkerPool {
    name: &'static str,
    tx: std::sync::OnceLock<Mutex<std::sync::mpsc::Sender<Job>>>,
    queued: Arc<AtomicU64>,
    threads: usize,
}

impl WorkerPool {
    /// A pool of `threads` threads named `h5t-NAME-i`.
    pub fn new(name: &'static str, threads: usize) -> Self {
        WorkerPool {
            name,
            tx: std::sync::OnceLock::new(),
            queued: Arc::new(AtomicU64::new(0)),
            threads,
        }
    }

    /// Queues `job`; gives it back when no worker could be started (the caller runs it).
    pub fn submit(&self, job: Job) -> std::result::Result<(), Job> {
        let tx = self.tx.get_or_init(|| {
            let (tx, rx) = std::sync::mpsc::channel::<Job>();
            let rx = Arc::new(Mutex::new(rx));
            for i in 0..self.threads {
                let rx = rx.clone();
                let queued = self.queued.clone();
                let spawned = std::thread::Builder::new()
                    .name(format!("h5t-{}-{i}", self.name))
                    .spawn(move || loop {
                        let job = rx.lock().recv();
                        match job {
                            Ok(job) => {
                                queued.fetch_sub(1, Ordering::Relaxed);
                                job()
                            }
                            Err(_) => return,
                        }
                    });
                if let Err(e) = spawned {
                    tracing::warn!(pool = self.name, error = %e, "worker thread not started");
                }
            }
            Mutex::new(tx)
        });
        self.queued.fetch_add(1, Ordering::Relaxed);
        let sent = tx.lock().send(job);
        sent.map_err(|e| {
            self.queued.fetch_sub(1, Ordering::Relaxed);
            e.0
        })
    }
}

impl CellCache {
    pub fn new(cap: u64) -> Self {
        CellCache {
            cap,
            inner: Mutex::new(CacheInner::default()),
            pool: WorkerPool::new(
                "decode",
                std::thread::available_parallelism()
                    .map_or(2, |n| n.get())
                    .clamp(1, 64),
            ),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            prefetched: AtomicU64::new(0),
            released: AtomicU64::new(0),
        }
    }

    pub fn bytes(&self) -> u64 {
        self.inner.lock().bytes
    }

    /// Drops `cells` that are decoded and cached (cells still loading stay): a
    /// sequential reader is done with them (`readahead::release_behind`). Their memory
    /// is freed outside the lock, once no reader holds them.
    pub fn release(&self, cells: &[CellRef]) {
        let dropped: Vec<_> = {
            let mut g = self.inner.lock();
            cells
                .iter()
                .filter_map(|c| g.remove_ready(&c.key()))
                .collect()
        };
        self.released
            .fetch_add(dropped.len() as u64, Ordering::Relaxed);
        drop(dropped);
    }

    fn claim(&self, cell: &CellRef) -> Claim {
        let key = cell.key();
        let mut g = self.inner.lock();
        g.tick += 1;
        let t = g.tick;
        let g = &mut *g;
        match g.map.get_mut(&key) {
            Some(Slot::Ready(d, used)) => {
                g.lru.remove(used);
                *used = t;
                g.lru.insert(t, key);
                Claim::Hit(d.clone())
            }
            Some(Slot::Loading(l)) => Claim::Wait(l.clone()),
            None => {
                let l = Arc::new(Loading::default());
                g.map.insert(key, Slot::Loading(l.clone()));
                Claim::Mine(l)
            }
        }
    }

    /// Decodes a claimed cell, publishes it (or its error) and wakes its waiters.
    fn fill(&self, cell: &CellRef, slot: &Loading) -> Result<Arc<Vec<u8>>> {
        let key = cell.key();
        let res = cell.source.load(cell.index).map(Arc::new);
        {
            let mut g = self.inner.lock();
            g.tick += 1;
            let t = g.tick;
            match &res {
                Ok(d) if (d.len() as u64) <= self.cap => {
                    g.bytes += d.len() as u64;
                    if let Some(Slot::Ready(old, used)) =
                        g.map.insert(key, Slot::Ready(d.clone(), t))
                    {
                        g.bytes -= old.len() as u64;
                        g.lru.remove(&used);
                    }
                    g.lru.insert(t, key);
                    while g.bytes > self.cap {
                        let Some((_, victim)) = g.lru.pop_first() else {
                            break;
                        };
                        g.remove_ready(&victim);
                    }
                }
                _ => {
                    g.map.remove(&key);
                }
            }
        }
        *slot.result.lock() = Some(match &res {
            Ok(d) => Ok(d.clone()),
            Err(e) => Err((e.errno, e.message.clone())),
        });
        slot.done.notify_all();
        res
    }

    /// The decoded bytes of `cell`, decoding it (outside the cache lock) on a miss.
    pub fn get(&self, cell: &CellRef) -> Result<Arc<Vec<u8>>> {
        match self.claim(cell) {
            Claim::Hit(d) => {
                self.hits.fetch_add(1, Ordering::Relaxed);
                Ok(d)
            }
            Claim::Wait(l) => {
                self.hits.fetch_add(1, Ordering::Relaxed);
                l.wait()
            }
            Claim::Mine(l) => {
                self.misses.fetch_add(1, Ordering::Relaxed);
                self.fill(cell, &l)
            }
        }
    }

    /// Decodes the cells of one request that are not cached, in parallel: all but one
    /// on the pool, one on the caller's thread, then waits for all of them. Errors are
    /// left for the reader's own `get` to report.
    pub fn warm(self: &Arc<Self>, cells: &[CellRef]) {
        let mut mine = Vec::new();
        let mut waits = Vec::new();
        for c in cells {
            match self.claim(c) {
                Claim::Hit(_) => {}
                Claim::Wait(l) => waits.push(l),
                Claim::Mine(l) => mine.push((c.clone(), l)),
            }
        }
        if mine.is_empty() {
            return;
        }
        self.misses.fetch_add(mine.len() as u64, Ordering::Relaxed);
        let last = mine.pop();
        for (c, l) in mine {
            waits.push(l.clone());
            let me = self.clone();
            if let Err(job) = self.pool.submit(Box::new(move || {
                let _ = me.fill(&c, &l);
            })) {
                job();
            }
        }
        if let Some((c, l)) = last {
            let _ = self.fill(&c, &l);
        }
        for l in waits {
            let _ = l.wait();
        }
    }

    /// Runs `job` on the decode pool (or here, if no worker could be started):
    /// background work of readers, such as read-ahead of backing files.
    pub fn background(&self, job: Box<dyn FnOnce() + Send>) {
        if let Err(job) = self.pool.submit(job) {
            job();
        }
    }

    /// Starts decoding `cells` in the background if they are not cached, as long as
    /// the pool has less than twice its threads of work queued (read-ahead must not
    /// crowd out the cells readers wait for).
    pub fn prefetch(self: &Arc<Self>, cells: &[CellRef]) {
        for c in cells {
            if self.pool.queued.load(Ordering::Relaxed) >= 2 * self.pool.threads as u64 {
                return;
            }
            let Claim::Mine(l) = self.claim(c) else {
                continue;
            };
            self.prefetched.fetch_add(1, Ordering::Relaxed);
            let me = self.clone();
            let c = c.clone();
            if let Err(job) = self.pool.submit(Box::new(move || {
                let _ = me.fill(&c, &l);
            })) {
                job();
            }
        }
    }
}

/// HDF5's Fletcher-32 checksum (H5_checksum_fletcher32).
pub fn fletcher32(data: &[u8]) -> u32 {
    let (mut s1, mut s2) = (0u32, 0u32);
    for block in data.chunks(720) {
        let mut words = block.chunks_exact(2);
        for w in &mut words {
            s1 = s1.wrapping_add(((w[0] as u32) << 8) | w[1] as u32);
            s2 = s2.wrapping_add(s1);
        }
        if let [b] = words.remainder() {
            s1 = s1.wrapping_add((*b as u32) << 8);
            s2 = s2.wrapping_add(s1);
        }
        s1 = (s1 & 0xffff) + (s1 >> 16);
        s2 = (s2 & 0xffff) + (s2 >> 16);
    }
    s1 = (s1 & 0xffff) + (s1 >> 16);
    s2 = (s2 & 0xffff) + (s2 >> 16);
    (s2 << 16) | s1
}

/// Reverses HDF5's byte shuffle for elements of `es` bytes.
pub fn unshuffle(data: &[u8], es: usize) -> Vec<u8> {
    if es <= 1 || data.len() < es {
        return data.to_vec();
    }
    let mut out = vec![0u8; data.len()];
    codecs::unshuffle_into(data, es, &mut out);
    out
}

/// Whether every filter of the pipeline has a Rust decoder.
pub fn rust_decodable(filters: &[FilterInfo]) -> bool {
    filters.iter().all(|f| codecs::builtin(f.id))
}

pub use crate::codecs::Failure;
pub use crate::h5::MAX_CELL_BYTES;

/// The most a stored (filtered) chunk may exceed its decoded size: deflate's worst
/// case is about 0.03 % plus a few bytes, each Fletcher-32 adds 4 bytes.
fn max_stored_bytes(decoded: u64) -> u64 {
    decoded.saturating_mul(2).saturating_add(1 << 16)
}

/// Inflates `input` into at most `cap` bytes; a stream inflating beyond `cap` is
/// refused after `cap + 1` bytes, so a deflate bomb never costs more than one chunk.
fn inflate_bounded(input: &[u8], cap: usize) -> std::result::Result<Vec<u8>, Failure> {
    let mut out = Vec::with_capacity(cap.saturating_add(1));
    let limit = (cap as u64).saturating_add(1);
    match flate2::read::ZlibDecoder::new(input)
        .take(limit)
        .read_to_end(&mut out)
    {
        Ok(_) if out.len() > cap => Err(Failure::Refused(format!(
            "its deflate stream inflates beyond the chunk's decoded size of {cap} bytes \
             (corrupt or crafted file)"
        ))),
        Ok(_) => Ok(out),
        Err(e) => Err(Failure::Corrupt(format!("deflate stream is corrupt: {e}"))),
    }
}

/// Runs the pipeline backwards over a stored chunk whose decoded size is `expect`.
/// `Failure::Corrupt`: HDF5 may try when it has every filter (its error then says
/// more); `Failure::Refused`: the chunk must not be decoded at all (it would decode
/// beyond its size: HDF5 would allocate what the stream says, then truncate it).
pub fn decode_chunk(
    raw: Vec<u8>,
    filters: &[FilterInfo],
    mask: u32,
    elem: usize,
    expect: usize,
) -> std::result::Result<Vec<u8>, Failure> {
    let active = |i: usize| i >= 32 || mask & (1 << i) == 0;
    let mut buf = raw;
    for (i, f) in filters.iter().enumerate().rev() {
        if !active(i) {
            continue;
        }
        // The bytes before this filter ran: the chunk plus the checksums of the
        // Fletcher-32 filters that ran earlier.
        let sums = (0..i).filter(|&j| active(j) && filters[j].id == 3).count();
        let cap = expect.saturating_add(4 * sums);
        buf = match f.id {
            1 => inflate_bounded(&buf, cap)?,
            2 => {
                let es = f.cd_values.first().map(|&v| v as usize).unwrap_or(elem);
                unshuffle(&buf, es)
            }
            3 => {
                if buf.len() < 4 {
                    return Err(Failure::Corrupt(
                        "Fletcher-32 chunk shorter than its checksum".into(),
                    ));
                }
                let n = buf.len() - 4;
                let stored = u32::from_le_bytes([buf[n], buf[n + 1], buf[n + 2], buf[n + 3]]);
                let sum = fletcher32(&buf[..n]);
                if stored != sum && stored != sum.swap_bytes() {
                    return Err(Failure::Corrupt(format!(
                        "Fletcher-32 checksum mismatch (stored {stored:#010x}, computed {sum:#010x})"
                    )));
                }
                buf.truncate(n);
                buf
            }
            id => match id {
                #[cfg(h5tilefs_szip)]
                codecs::SZIP => crate::ccodecs::szip_filter(&buf, &f.cd_values, cap),
                codecs::BLOSC2 => crate::ccodecs::blosc2_filter(&buf, cap),
                _ => codecs::decode(id, &f.cd_values, elem, &buf, cap),
            }
            .map_err(|e| match e {
                Failure::Corrupt(m) => Failure::Corrupt(format!("{} filter: {m}", f.name)),
                Failure::Refused(m) => Failure::Refused(format!("{} filter: {m}", f.name)),
            })?,
        };
    }
    if buf.len() != expect {
        return Err(Failure::Corrupt(format!(
            "decodes to {} bytes where the chunk holds {expect}",
            buf.len()
        )));
    }
    Ok(buf)
}

/// Reads cell `index` of a regular grid of `cell`-shaped blocks through the HDF5
/// library, laid out over the full cell shape (edge cells padded).
fn read_cell(
    dset: &hdf5::Dataset,
    grid: &[u64],
    cell: &[u64],
    shape: &[u64],
    elem: u64,
    index: u64,
) -> Result<Vec<u8>> {
    let start: Vec<u64> = unravel(index, grid)
        .iter()
        .zip(cell)
        .map(|(i, c)| i * c)
        .collect();
    let count: Vec<u64> = start
        .iter()
        .zip(cell)
        .zip(shape)
        .map(|((s, c), n)| (*c).min(n - s))
        .collect();
    let ftype = h5::dtype(dset.id())?;
    h5::read_region(dset.id(), &ftype, elem as usize, &start, &count, cell)
}

/// The chunks of a chunked dataset: where each is stored (looked up lazily and
/// remembered) and how a filtered one is decoded.
pub struct ChunkStore {
    uid: u64,
    /// The dataset's path in its file, for error messages.
    pub name: String,
    pub file: Arc<BackingFile>,
    dset: hdf5::Dataset,
    pub shape: Vec<u64>,
    pub chunk: Vec<u64>,
    pub grid: Vec<u64>,
    pub elem: u64,
    pub filters: Vec<FilterInfo>,
    /// Bytes of one decoded chunk (checked when built).
    bytes: u64,
    locs: DashMap<u64, Option<ChunkLoc>>,
}

impl ChunkStore {
    /// Fails (EFBIG) when a chunk's byte size overflows: a corrupt layout message.
    pub fn new(
        name: &str,
        file: Arc<BackingFile>,
        dset: hdf5::Dataset,
        shape: Vec<u64>,
        chunk: Vec<u64>,
        elem: u64,
        filters: Vec<FilterInfo>,
    ) -> Result<Self> {
        if chunk.len() != shape.len() || chunk.contains(&0) {
            return Err(Error::io(format!(
                "{}: dataset {name}: bad chunk shape {chunk:?} for shape {shape:?}",
                file.path.display()
            )));
        }
        let bytes = crate::geometry::checked_bytes(&chunk, elem).ok_or_else(|| {
            Error::new(
                libc::EFBIG,
                format!(
                    "{}: dataset {name}: chunk shape {chunk:?} of {elem}-byte elements \
                     overflows (corrupt layout message)",
                    file.path.display()
                ),
            )
        })?;
        let grid = shape
            .iter()
            .zip(&chunk)
            .map(|(s, c)| s.div_ceil(*c))
            .collect();
        Ok(ChunkStore {
            uid: next_uid(),
            name: name.to_string(),
            file,
            dset,
            shape,
            chunk,
            grid,
            elem,
            filters,
            bytes,
            locs: DashMap::new(),
        })
    }

    fn chunk_start(&self, index: u64) -> Vec<u64> {
        unravel(index, &self.grid)
            .iter()
            .zip(&self.chunk)
            .map(|(i, c)| i * c)
            .collect()
    }

    /// "FILE: dataset NAME: chunk N at [i, j]" for error messages.
    fn what(&self, index: u64) -> String {
        format!(
            "{}: dataset {}: chunk {index} at {:?}",
            self.file.path.display(),
            self.name,
            self.chunk_start(index)
        )
    }

    /// Where chunk `index` is stored; `None` if it was never written. A location whose
    /// end overflows the file offsets (corrupt chunk index) is an error (EIO).
    pub fn loc(&self, index: u64) -> Result<Option<ChunkLoc>> {
        if let Some(l) = self.locs.get(&index) {
            return Ok(*l);
        }
        let l = h5::chunk_by_coord(self.dset.id(), &self.chunk_start(index))?;
        if let Some(loc) = &l {
            if loc.addr.checked_add(loc.size).is_none() {
                return Err(Error::io(format!(
                    "{}: stored at {} with {} bytes, past any file offset (corrupt chunk index)",
                    self.what(index),
                    loc.addr,
                    loc.size
                )));
            }
        }
        self.locs.insert(index, l);
        Ok(l)
    }

    /// True when chunk bytes are stored verbatim (no filter applied to this chunk).
    pub fn is_raw(&self, loc: &ChunkLoc) -> bool {
        let active = self
            .filters
            .iter()
            .enumerate()
            .any(|(i, _)| i >= 32 || loc.filter_mask & (1 << i) == 0);
        !active && loc.size == self.cell_bytes()
    }

    /// "gzip (1), shuffle (2)" for messages.
    fn pipeline(&self) -> String {
        let names: Vec<String> = self
            .filters
            .iter()
            .map(|f| format!("{} ({}, {})", f.name, f.id, f.decoder.as_str()))
            .collect();
        names.join(", ")
    }

    /// Reads a chunk through libhdf5; a failure names the file, dataset, chunk and
    /// filters around HDF5's own error stack.
    fn read_through_hdf5(&self, index: u64) -> Result<Vec<u8>> {
        read_cell(
            &self.dset,
            &self.grid,
            &self.chunk,
            &self.shape,
            self.elem,
            index,
        )
        .map_err(|e| {
            let msg = if self.filters.is_empty() {
                format!("{}: {}", self.what(index), e.message)
            } else {
                format!(
                    "{}: decoding through libhdf5 with filters [{}] failed: {}",
                    self.what(index),
                    self.pipeline(),
                    e.message
                )
            };
            Error::new(e.errno, msg)
        })
    }

    /// Checks a stored chunk's size and place before anything (ours or HDF5's) reads
    /// it: both come from the file's chunk index and size the read buffer.
    fn check_stored(&self, index: u64, loc: &ChunkLoc) -> Result<()> {
        let refuse =
            |why: String| Error::from(ModelError::Corrupt(format!("{}: {why}", self.what(index))));
        if loc.size > max_stored_bytes(self.bytes) {
            return Err(refuse(format!(
                "stored size of {} bytes is implausible for a chunk of {} bytes \
                 (corrupt chunk index)",
                loc.size, self.bytes
            )));
        }
        let file_len = self
            .file
            .file
            .metadata()
            .map_err(|e| Error::from_io(format!("{}: fstat", self.file.path.display()), e))?
            .len();
        if loc.addr.saturating_add(loc.size) > file_len {
            return Err(refuse(format!(
                "stored at {}..{} past the end of the file ({file_len} bytes): \
                 truncated or corrupt file",
                loc.addr,
                loc.addr.saturating_add(loc.size)
            )));
        }
        Ok(())
    }

    /// Reads and decodes a stored chunk (checked by `check_stored`) in Rust.
    /// `Ok(None)`: HDF5 must decode it (our decoder found it corrupt and libhdf5 has
    /// every filter: its error, or its result, is the reference).
    fn decode_stored(&self, index: u64, loc: &ChunkLoc, expect: usize) -> Result<Option<Vec<u8>>> {
        let refuse =
            |why: String| Error::from(ModelError::Corrupt(format!("{}: {why}", self.what(index))));
        let size = usize::try_from(loc.size).map_err(|_| refuse("stored size too large".into()))?;
        let mut raw = vec![0u8; size];
        self.file
            .file
            .read_exact_at(&mut raw, loc.addr)
            .map_err(|e| Error::from_io(format!("reading {}", self.what(index)), e))?;
        match decode_chunk(
            raw,
            &self.filters,
            loc.filter_mask,
            self.elem as usize,
            expect,
        ) {
            Ok(out) => Ok(Some(out)),
            Err(Failure::Refused(why)) => Err(refuse(format!(
                "filters [{}]: {why}; the chunk is not served",
                self.pipeline()
            ))),
            Err(Failure::Corrupt(why)) if self.filters.iter().all(|f| f.hdf5) => {
                tracing::debug!(
                    file = %self.file.path.display(),
                    dataset = %self.name,
                    index,
                    filters = %self.pipeline(),
                    %why,
                    "chunk not decodable in Rust, trying libhdf5"
                );
                Ok(None)
            }
            Err(Failure::Corrupt(why)) => Err(refuse(format!(
                "filters [{}]: {why} (corrupt chunk; libhdf5 has no decoder to compare)",
                self.pipeline()
            ))),
        }
    }
}

impl CellSource for ChunkStore {
    fn uid(&self) -> u64 {
        self.uid
    }

    fn cell_bytes(&self) -> u64 {
        self.bytes
    }

    fn load(&self, index: u64) -> Result<Vec<u8>> {
        if self.bytes > MAX_CELL_BYTES {
            return Err(Error::new(
                libc::EFBIG,
                format!(
                    "{}: decoding needs {} bytes, more than the limit of {MAX_CELL_BYTES} \
                     (rechunk the dataset smaller)",
                    self.what(index),
                    self.bytes
                ),
            ));
        }
        let expect = self.bytes as usize;
        let Some(loc) = self.loc(index)? else {
            return self.read_through_hdf5(index);
        };
        self.check_stored(index, &loc)?;
        if rust_decodable(&self.filters) {
            if let Some(out) = self.decode_stored(index, &loc, expect)? {
                return Ok(out);
            }
        }
        self.read_through_hdf5(index)
    }
}

/// A dataset read through the HDF5 library in blocks of `cell` elements: compact
/// storage, external storage, and virtual datasets we do not map ourselves.
pub struct HdfCells {
    uid: u64,
    dset: hdf5::Dataset,
    pub shape: Vec<u64>,
    pub cell: Vec<u64>,
    pub grid: Vec<u64>,
    pub elem: u64,
}

impl HdfCells {
    pub fn new(dset: hdf5::Dataset, shape: Vec<u64>, cell: Vec<u64>, elem: u64) -> Self {
        let grid = shape
            .iter()
            .zip(&cell)
            .map(|(s, c)| s.div_ceil((*c).max(1)))
            .collect();
        HdfCells {
            uid: next_uid(),
            dset,
            shape,
            cell,
            grid,
            elem,
        }
    }
}

impl CellSource for HdfCells {
    fn uid(&self) -> u64 {
        self.uid
    }

    fn cell_bytes(&self) -> u64 {
        crate::geometry::checked_bytes(&self.cell, self.elem).unwrap_or(u64::MAX)
    }

    fn load(&self, index: u64) -> Result<Vec<u8>> {
        read_cell(
            &self.dset,
            &self.grid,
            &self.cell,
            &self.shape,
            self.elem,
            index,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn fletcher_known_value() {
        // Reference from the HDF5 test suite style: sum over "abcde" as 16-bit words.
        let v = fletcher32(b"abcde");
        let (mut s1, mut s2) = (0u32, 0u32);
        for w in [0x6162u32, 0x6364, 0x6500] {
            s1 += w;
            s2 += s1;
        }
        s1 = (s1 & 0xffff) + (s1 >> 16);
        s2 = (s2 & 0xffff) + (s2 >> 16);
        assert_eq!(v, (s2 << 16) | s1);
    }

    #[test]
    fn shuffle_roundtrip() {
        let data: Vec<u8> = (0..23).collect();
        let es = 4;
        let n = data.len() / es;
        let mut sh = vec![0u8; data.len()];
        for i in 0..n {
            for b in 0..es {
                sh[b * n + i] = data[i * es + b];
            }
        }
        sh[n * es..].copy_from_slice(&data[n * es..]);
        assert_eq!(unshuffle(&sh, es), data);
    }

    #[test]
    fn pipeline_deflate_and_checksum() {
        let data: Vec<u8> = (0..4000u32).flat_map(|v| v.to_le_bytes()).collect();
        let mut enc = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::new(4));
        enc.write_all(&data).unwrap();
        let mut z = enc.finish().unwrap();
        let sum = fletcher32(&z);
        z.extend_from_slice(&sum.to_le_bytes());
        let f = filter;
        let filters = vec![f(1), f(3)];
        assert_eq!(
            decode_chunk(z.clone(), &filters, 0, 4, data.len()),
            Ok(data.clone())
        );
        // A corrupted checksum is not trusted: HDF5 decides.
        let mut bad = z;
        let n = bad.len();
        bad[n - 1] ^= 0xff;
        assert!(matches!(
            decode_chunk(bad, &filters, 0, 4, data.len()),
            Err(Failure::Corrupt(_))
        ));
        // Wrong expected size is refused.
        assert!(matches!(
            decode_chunk(vec![1, 2, 3], &[], 0, 1, 4),
            Err(Failure::Corrupt(_))
        ));
    }

    fn filter(id: i32) -> FilterInfo {
        FilterInfo {
            id,
            name: String::new(),
            cd_values: vec![],
            decoder: crate::h5::Decoder::BuiltIn,
            optional: false,
            hdf5: true,
        }
    }

    /// A zlib stream of `n` zeros, made without holding them.
    fn zeros_stream(n: usize) -> Vec<u8> {
        let mut enc = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
        let block = vec![0u8; 1 << 20];
        for _ in 0..n >> 20 {
            enc.write_all(&block).unwrap();
        }
        enc.finish().unwrap()
    }

    #[test]
    fn deflate_bomb_fails_fast_with_bounded_memory() {
        // 1 GiB of zeros declared as a 4 KiB chunk: refused after 4 KiB + 1 byte of
        // output, where the unbounded read_to_end allocated and filled 1 GiB.
        let z = zeros_stream(1 << 30);
        assert!(z.len() < 2 << 20);
        let t = std::time::Instant::now();
        let r = decode_chunk(z, &[filter(1)], 0, 4, 4096);
        let why = r.expect_err("a stream inflating past its chunk must be refused");
        assert!(matches!(why, Failure::Refused(_)));
        let why = why.message().to_string();
        assert!(
            why.contains("inflates beyond") && why.contains("4096"),
            "{why}"
        );
        assert!(
            t.elapsed() < std::time::Duration::from_millis(200),
            "{:?}",
            t.elapsed()
        );
        // The same bound holds after a shuffle and with a checksum inside the deflate.
        let z = zeros_stream(64 << 20);
        assert!(decode_chunk(z, &[filter(2), filter(1)], 0, 4, 4096).is_err());
        // A stream of exactly the chunk's size still decodes, checksum inside included:
        // the Fletcher-32 that ran before deflate adds 4 bytes to what it inflates to.
        let data = vec![7u8; 4096];
        let mut inner = data.clone();
        inner.extend_from_slice(&fletcher32(&data).to_le_bytes());
        let mut enc = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::new(4));
        enc.write_all(&inner).unwrap();
        let z = enc.finish().unwrap();
        assert_eq!(
            decode_chunk(z.clone(), &[filter(3), filter(1)], 0, 1, 4096),
            Ok(data)
        );
        // One byte short of the checksum: it no longer fits.
        assert!(decode_chunk(z, &[filter(1)], 0, 1, 4096).is_err());
        // A filter skipped by the chunk's mask is not run.
        assert_eq!(
            decode_chunk(vec![9u8; 16], &[filter(1)], 1, 1, 16),
            Ok(vec![9u8; 16])
        );
    }

    #[test]
    fn stored_size_bound() {
        assert_eq!(max_stored_bytes(4096), 8192 + 65536);
        assert_eq!(max_stored_bytes(u64::MAX), u64::MAX);
    }

    struct Counting(AtomicU64);
    impl CellSource for Counting {
        fn uid(&self) -> u64 {
            999_999
        }
        fn cell_bytes(&self) -> u64 {
            100
        }
        fn load(&self, index: u64) -> Result<Vec<u8>> {
            self.0.fetch_add(1, Ordering::Relaxed);
            Ok(vec![index as u8; 100])
        }
    }

    /// Cell `index` of a `Counting` source.
    fn counted(src: &Arc<Counting>, index: u64) -> CellRef {
        CellRef {
            source: src.clone(),
            index,
        }
    }

    #[test]
    fn cache_is_bounded_and_hits() {
        let cache = CellCache::new(250);
        let src = Arc::new(Counting(AtomicU64::new(0)));
        for i in 0..10u64 {
            let c = CellRef {
                source: src.clone(),
                index: i % 2,
            };
            assert_eq!(cache.get(&c).unwrap()[0], (i % 2) as u8);
        }
        assert_eq!(src.0.load(Ordering::Relaxed), 2);
        for i in 2..6u64 {
            let c = CellRef {
                source: src.clone(),
                index: i,
            };
            cache.get(&c).unwrap();
        }
        assert!(cache.bytes() <= 250);
    }

    /// Eviction takes the least recently used cell: a cell read again stays.
    #[test]
    fn eviction_takes_the_least_recently_used() {
        let cache = CellCache::new(300);
        let src = Arc::new(Counting(AtomicU64::new(0)));
        let cell = |index| counted(&src, index);
        for i in 0..3 {
            cache.get(&cell(i)).unwrap();
        }
        cache.get(&cell(0)).unwrap(); // 0 is now the most recent
        cache.get(&cell(3)).unwrap(); // evicts 1
        assert_eq!(src.0.load(Ordering::Relaxed), 4);
        cache.get(&cell(0)).unwrap();
        cache.get(&cell(2)).unwrap();
        assert_eq!(src.0.load(Ordering::Relaxed), 4, "0 and 2 stayed");
        cache.get(&cell(1)).unwrap();
        assert_eq!(src.0.load(Ordering::Relaxed), 5, "1 was evicted");
        assert!(cache.bytes() <= 300);
    }

    /// Released cells leave the cache and its byte count, and their LRU entries go
    /// too (a later eviction must not trip over them); a reader still holding one
    /// keeps its bytes; cells not cached are ignored.
    #[test]
    fn released_cells_leave_the_cache() {
        let cache = CellCache::new(1000);
        let src = Arc::new(Counting(AtomicU64::new(0)));
        let cell = |index| counted(&src, index);
        let held = cache.get(&cell(1)).unwrap();
        for i in [0, 2, 3] {
            cache.get(&cell(i)).unwrap();
        }
        assert_eq!(cache.bytes(), 400);
        cache.release(&[cell(0), cell(1), cell(9)]);
        assert_eq!(cache.bytes(), 200);
        assert_eq!(cache.released.load(Ordering::Relaxed), 2);
        assert_eq!(held[0], 1, "a held cell keeps its bytes");
        assert_eq!(cache.inner.lock().lru.len(), 2);
        cache.get(&cell(0)).unwrap();
        assert_eq!(
            src.0.load(Ordering::Relaxed),
            5,
            "a released cell decodes again"
        );
        cache.get(&cell(2)).unwrap();
        assert_eq!(src.0.load(Ordering::Relaxed), 5, "others stayed");
        for i in 10..30 {
            cache.get(&cell(i)).unwrap();
        }
        assert!(cache.bytes() <= 1000);
    }

    /// A slow source that records how many loads ran at once; index 7 fails.
    struct Slow {
        uid: u64,
        loads: AtomicU64,
        running: AtomicU64,
        peak: AtomicU64,
    }
    impl Slow {
        fn new(uid: u64) -> Arc<Self> {
            Arc::new(Slow {
                uid,
                loads: AtomicU64::new(0),
                running: AtomicU64::new(0),
                peak: AtomicU64::new(0),
            })
        }
    }
    impl CellSource for Slow {
        fn uid(&self) -> u64 {
            self.uid
        }
        fn cell_bytes(&self) -> u64 {
            64
        }
        fn load(&self, index: u64) -> Result<Vec<u8>> {
            self.loads.fetch_add(1, Ordering::Relaxed);
            let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
            self.peak.fetch_max(now, Ordering::SeqCst);
            std::thread::sleep(std::time::Duration::from_millis(30));
            self.running.fetch_sub(1, Ordering::SeqCst);
            if index == 7 {
                return Err(Error::io("cell 7 is corrupt"));
            }
            Ok(vec![index as u8; 64])
        }
    }

    fn cell(src: &Arc<Slow>, index: u64) -> CellRef {
        CellRef {
            source: src.clone(),
            index,
        }
    }

    #[test]
    fn concurrent_readers_of_one_cell_decode_it_once() {
        let cache = Arc::new(CellCache::new(1 << 20));
        let src = Slow::new(1_000_001);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| assert_eq!(cache.get(&cell(&src, 3)).unwrap()[0], 3));
            }
        });
        assert_eq!(src.loads.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_failed_decode_reaches_every_waiter_and_is_not_cached() {
        let cache = Arc::new(CellCache::new(1 << 20));
        let src = Slow::new(1_000_002);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    let e = cache.get(&cell(&src, 7)).unwrap_err();
                    assert!(e.message.contains("cell 7 is corrupt"), "{}", e.message);
                });
            }
        });
        let before = src.loads.load(Ordering::Relaxed);
        assert!(cache.get(&cell(&src, 7)).is_err());
        assert_eq!(
            src.loads.load(Ordering::Relaxed),
            before + 1,
            "errors are retried, not cached"
        );
        assert_eq!(cache.bytes(), 0);
    }

    #[test]
    fn warm_decodes_a_requests_cells_in_parallel_then_serves_hits() {
        let cache = Arc::new(CellCache::new(1 << 20));
        let src = Slow::new(1_000_003);
        let cells: Vec<_> = (0..6).map(|i| cell(&src, i)).collect();
        cache.warm(&cells);
        assert_eq!(src.loads.load(Ordering::Relaxed), 6);
        if std::thread::available_parallelism().map_or(1, |n| n.get()) >= 2 {
            assert!(
                src.peak.load(Ordering::SeqCst) >= 2,
                "cells decoded one after another"
            );
        }
        for c in &cells {
            assert_eq!(cache.get(c).unwrap()[0], c.index as u8);
        }
        assert_eq!(src.loads.load(Ordering::Relaxed), 6, "warm cells are hits");
    }

    #[test]
    fn prefetch_fills_the_cache_in_the_background() {
        let cache = Arc::new(CellCache::new(1 << 20));
        let src = Slow::new(1_000_004);
        let cells: Vec<_> = (0..3).map(|i| cell(&src, i)).collect();
        cache.prefetch(&cells);
        // A reader arriving while the prefetch runs waits for it instead of decoding.
        for c in &cells {
            assert_eq!(cache.get(c).unwrap()[0], c.index as u8);
        }
        assert_eq!(src.loads.load(Ordering::Relaxed), 3);
        assert_eq!(cache.prefetched.load(Ordering::Relaxed), 3);
    }
}
