//! Encoders for the compressed chunked layout (docs/namespace.md, "Compressed chunked
//! datasets"): a compression declared in meta.json with h5py's names, the HDF5 filter
//! pipeline it stands for (standard ids, so h5py with hdf5plugin reads the file), and
//! the encoding of one whole chunk through that pipeline.
//!
//! A chunk the pipeline would make larger than it is stored raw, every filter skipped in
//! its filter mask (as libhdf5 does when an optional filter fails): a chunk then never
//! outgrows the slot the layout reserves for it, which is the chunk's own size.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::io::Write;

pub use super::{BLOSC, DEFLATE, LZ4, SHUFFLE, ZSTD};

/// The codec of a compressed chunked dataset.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Codec {
    /// zlib stream at this level (0-9; h5py's default 4).
    Gzip(u32),
    /// Zstandard frame at this level (hdf5plugin's default 3).
    Zstd(i32),
    /// hdf5plugin's LZ4 framing: one block per chunk.
    Lz4,
    /// A Blosc (c-blosc 1.x format) chunk: blocks each shuffled as Blosc's own setting
    /// says, then compressed with its inner codec.
    Blosc(Blosc),
}

/// Blosc's inner codec (hdf5plugin's `cname`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum BloscName {
    Blosclz,
    Lz4,
    Lz4hc,
    Zlib,
    Zstd,
}

impl BloscName {
    const ALL: [BloscName; 5] = [
        BloscName::Blosclz,
        BloscName::Lz4,
        BloscName::Lz4hc,
        BloscName::Zlib,
        BloscName::Zstd,
    ];

    pub fn name(self) -> &'static str {
        match self {
            BloscName::Blosclz => "blosclz",
            BloscName::Lz4 => "lz4",
            BloscName::Lz4hc => "lz4hc",
            BloscName::Zlib => "zlib",
            BloscName::Zstd => "zstd",
        }
    }

    /// The compressor code of the filter's client data (c-blosc's BLOSC_LZ4 ...;
    /// 3, Snappy, is not written).
    fn code(self) -> u32 {
        match self {
            BloscName::Blosclz => 0,
            BloscName::Lz4 => 1,
            BloscName::Lz4hc => 2,
            BloscName::Zlib => 4,
            BloscName::Zstd => 5,
        }
    }

    /// The stream format in a chunk's header flags (LZ4 and LZ4HC share one).
    fn format(self) -> u8 {
        match self {
            BloscName::Blosclz => 0,
            BloscName::Lz4 | BloscName::Lz4hc => 1,
            BloscName::Zlib => 3,
            BloscName::Zstd => 4,
        }
    }
}

/// Blosc's settings, with hdf5plugin.Blosc's defaults (lz4, level 5, byte shuffle).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Blosc {
    pub cname: BloscName,
    /// 0-9; 0 stores every chunk copied.
    pub clevel: u8,
    /// 0 none, 1 byte shuffle, 2 bit shuffle (within each block).
    pub shuffle: u8,
}

impl Default for Blosc {
    fn default() -> Self {
        Blosc {
            cname: BloscName::Lz4,
            clevel: 5,
            shuffle: 1,
        }
    }
}

const BLOSC_SHUFFLES: [&str; 3] = ["noshuffle", "shuffle", "bitshuffle"];

impl Blosc {
    /// meta.json's `compression_opts` for blosc: none (the defaults), a level, an
    /// object `{"cname", "clevel", "shuffle"}` (hdf5plugin.Blosc's arguments; shuffle
    /// as 0/1/2 or Zarr's names), or hdf5plugin.Blosc's seven `filter_options` (the
    /// first four are the filter's own and ignored).
    fn parse(opts: Option<&Value>) -> Result<Blosc, String> {
        const HOW: &str = "\"compression_opts\" of blosc must be a level (0-9), \
             {\"cname\": \"lz4\"|\"lz4hc\"|\"blosclz\"|\"zlib\"|\"zstd\", \"clevel\": 0-9, \
             \"shuffle\": 0|1|2} or hdf5plugin.Blosc's seven filter options";
        let mut b = Blosc::default();
        let level = |v: &Value| v.as_u64().filter(|l| *l <= 9).map(|l| l as u8);
        let shuffle = |v: &Value| match v {
            Value::String(s) => BLOSC_SHUFFLES.iter().position(|n| n == s).map(|i| i as u8),
            v => v.as_u64().filter(|s| *s <= 2).map(|s| s as u8),
        };
        match opts {
            None | Some(Value::Null) => {}
            Some(Value::Object(o)) => {
                for (k, v) in o {
                    let ok = match k.as_str() {
                        "cname" => v
                            .as_str()
                            .and_then(|n| BloscName::ALL.into_iter().find(|c| c.name() == n))
                            .map(|c| b.cname = c),
                        "clevel" => level(v).map(|l| b.clevel = l),
                        "shuffle" => shuffle(v).map(|s| b.shuffle = s),
                        _ => None,
                    };
                    if ok.is_none() {
                        return Err(format!("{HOW}; not \"{k}\": {v}"));
                    }
                }
            }
            Some(Value::Array(a)) if a.len() == 7 => {
                let cname = a[6]
                    .as_u64()
                    .and_then(|c| BloscName::ALL.into_iter().find(|n| n.code() as u64 == c));
                match (level(&a[4]), shuffle(&a[5]), cname) {
                    (Some(l), Some(s), Some(c)) => {
                        b = Blosc {
                            cname: c,
                            clevel: l,
                            shuffle: s,
                        }
                    }
                    _ => return Err(format!("{HOW}, not {}", Value::Array(a.clone()))),
                }
            }
            Some(v) => b.clevel = level(v).ok_or_else(|| format!("{HOW}, not {v}"))?,
        }
        Ok(b)
    }

    /// The settings of Blosc's filter client data (level, shuffle and compressor at
    /// 4, 5 and 6), for libhdf5's encoding of a fill chunk; None for a compressor not
    /// written here.
    pub fn from_client_data(cd: &[u32]) -> Option<Blosc> {
        let d = Blosc::default();
        Some(Blosc {
            clevel: cd.get(4).map_or(Some(d.clevel), |&l| {
                u8::try_from(l).ok().filter(|l| *l <= 9)
            })?,
            shuffle: cd.get(5).map_or(Some(d.shuffle), |&s| {
                u8::try_from(s).ok().filter(|s| *s <= 2)
            })?,
            cname: match cd.get(6) {
                None => d.cname,
                Some(&c) => BloscName::ALL.into_iter().find(|n| n.code() == c)?,
            },
        })
    }

    fn to_json(self) -> Value {
        json!({"cname": self.cname.name(), "clevel": self.clevel, "shuffle": self.shuffle})
    }
}

/// A dataset's compression: its codec, after a byte shuffle when `shuffle` is set.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compression {
    pub codec: Codec,
    pub shuffle: bool,
}

/// One filter of the pipeline: its id and client data, in HDF5's order (applied first
/// to last when writing).
pub type FilterSpec = (i32, Vec<u32>);

impl Compression {
    /// The compression of meta.json's `compression`, `compression_opts` and `shuffle`
    /// (h5py's names; a filter id is taken for a name), or `None` without compression.
    /// The error says what is accepted.
    pub fn parse(
        compression: Option<&Value>,
        opts: Option<&Value>,
        shuffle: Option<&Value>,
    ) -> Result<Option<Compression>, String> {
        let shuffle = match shuffle {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(v) => return Err(format!("\"shuffle\" must be true or false, not {v}")),
        };
        let name = match compression {
            None | Some(Value::Null) => {
                if shuffle || opts.is_some_and(|o| !o.is_null()) {
                    return Err(
                        "\"shuffle\" and \"compression_opts\" need a \"compression\" (gzip, zstd, lz4 or blosc)"
                            .into(),
                    );
                }
                return Ok(None);
            }
            Some(Value::String(s)) => s.clone(),
            Some(Value::Number(n)) => match n.as_i64() {
                Some(1) => "gzip".into(),
                Some(32015) => "zstd".into(),
                Some(32004) => "lz4".into(),
                Some(32001) => "blosc".into(),
                _ => format!("filter {n}"),
            },
            Some(v) => {
                return Err(format!(
                    "\"compression\" must be a name or a filter id, not {v}"
                ))
            }
        };
        let level = |lo: i64, hi: i64, default: i64| -> Result<i64, String> {
            match opts {
                None | Some(Value::Null) => Ok(default),
                Some(v) => v.as_i64().filter(|l| (lo..=hi).contains(l)).ok_or_else(|| {
                    format!(
                        "\"compression_opts\" of {name} must be a level from {lo} to {hi}, not {v}"
                    )
                }),
            }
        };
        let codec = match name.as_str() {
            "gzip" => Codec::Gzip(level(0, 9, 4)? as u32),
            "zstd" => Codec::Zstd(level(-131072, 22, 3)? as i32),
            "lz4" => {
                if opts.is_some_and(|o| !o.is_null()) {
                    return Err("lz4 takes no \"compression_opts\"".into());
                }
                Codec::Lz4
            }
            "blosc" => Codec::Blosc(Blosc::parse(opts)?),
            other => {
                return Err(format!(
                    "\"compression\" {other:?} is not one the mount writes: use gzip, zstd, lz4 or blosc"
                ))
            }
        };
        Ok(Some(Compression { codec, shuffle }))
    }

    /// The meta.json keys that declare this compression.
    pub fn to_json(&self) -> (Value, Value) {
        match self.codec {
            Codec::Gzip(l) => (json!("gzip"), json!(l)),
            Codec::Zstd(l) => (json!("zstd"), json!(l)),
            Codec::Lz4 => (json!("lz4"), Value::Null),
            Codec::Blosc(b) => (json!("blosc"), b.to_json()),
        }
    }

    /// The HDF5 pipeline, as h5py and hdf5plugin write it: shuffle (its client data
    /// the element size) before the codec; Blosc's client data as its filter's
    /// `set_local` completes it (revision, format, type size, chunk bytes, then the
    /// level, shuffle and compressor).
    pub fn filters(&self, itemsize: u32, chunk_bytes: u32) -> Vec<FilterSpec> {
        let mut f = Vec::new();
        if self.shuffle {
            f.push((SHUFFLE, vec![itemsize]));
        }
        f.push(match self.codec {
            Codec::Gzip(l) => (DEFLATE, vec![l]),
            // the level as an unsigned int, as hdf5plugin stores it
            Codec::Zstd(l) => (ZSTD, vec![l as u32]),
            Codec::Lz4 => (LZ4, vec![0]),
            Codec::Blosc(b) => (
                BLOSC,
                vec![
                    2,
                    2,
                    blosc_typesize(itemsize as usize) as u32,
                    chunk_bytes,
                    b.clevel.into(),
                    b.shuffle.into(),
                    b.cname.code(),
                ],
            ),
        });
        f
    }

    /// `chunk` (one whole chunk of `itemsize`-byte elements) through the pipeline: the
    /// stored bytes and the chunk's filter mask (every filter skipped when compression
    /// would not make it smaller).
    pub fn encode(&self, chunk: &[u8], itemsize: usize) -> (Vec<u8>, u32) {
        let nfilters = if self.shuffle { 2 } else { 1 };
        let shuffled;
        let data = if self.shuffle && itemsize > 1 {
            shuffled = shuffle(chunk, itemsize);
            &shuffled[..]
        } else {
            chunk
        };
        match compress(&self.codec, data, itemsize) {
            Some(o) if o.len() < chunk.len() => (o, 0),
            _ => (chunk.to_vec(), (1u32 << nfilters) - 1),
        }
    }
}

/// The Zarr v3 codec (after `bytes`) that stores chunks as this compression does, if
/// Zarr has one: zstd, gzip or blosc without HDF5's shuffle. A pending dataset's Zarr
/// view shows it and serves and takes its chunks encoded with it; otherwise chunks are
/// raw bytes.
pub fn zarr_codec(c: &Compression, itemsize: usize) -> Option<Value> {
    match (&c.codec, c.shuffle) {
        (Codec::Zstd(l), false) => {
            Some(json!({"name": "zstd", "configuration": {"level": l, "checksum": false}}))
        }
        (Codec::Gzip(l), false) => Some(json!({"name": "gzip", "configuration": {"level": l}})),
        (Codec::Blosc(b), false) => Some(json!({"name": "blosc", "configuration": {
            "cname": b.cname.name(),
            "clevel": b.clevel,
            "shuffle": BLOSC_SHUFFLES[usize::from(b.shuffle.min(2))],
            "typesize": blosc_typesize(itemsize),
            "blocksize": 0,
        }})),
        _ => None,
    }
}

/// A chunk as Zarr's codec of the same name writes it (a gzip member, a Zstandard
/// frame, a Blosc chunk), for a pending chunk read through the Zarr view.
pub fn encode_zarr(codec: &Codec, data: &[u8], itemsize: usize) -> Option<Vec<u8>> {
    match *codec {
        Codec::Gzip(l) => {
            let mut e = flate2::write::GzEncoder::new(
                Vec::with_capacity(data.len() / 2),
                flate2::Compression::new(l),
            );
            e.write_all(data).and_then(|_| e.finish()).ok()
        }
        Codec::Zstd(l) => zstd::bulk::compress(data, l).ok(),
        Codec::Blosc(b) => Some(blosc_chunk(b, data, itemsize)),
        Codec::Lz4 => None,
    }
}

/// A chunk Zarr's codec of the same name wrote (a gzip member, a Zstandard frame, a
/// Blosc chunk), decoded back to the chunk's bytes: at most `cap` bytes are produced,
/// whatever sizes the stream declares, and a stream that decodes to fewer is refused
/// as well (a Zarr chunk is always whole, an edge chunk padded).
pub fn decode_zarr(codec: &Codec, input: &[u8], cap: usize) -> super::Out {
    let out = match codec {
        Codec::Gzip(_) => super::gzip_member(input, cap)?,
        Codec::Zstd(_) => super::zstd_filter(input, cap)?,
        Codec::Blosc(_) => super::filters::blosc(input, cap)?,
        Codec::Lz4 => return super::corrupt("Zarr has no lz4 codec"),
    };
    if out.len() != cap {
        return super::corrupt(format!(
            "it decodes to {} bytes, not the chunk's {cap}",
            out.len()
        ));
    }
    Ok(out)
}

/// `data` (elements of `itemsize` bytes) through `codec` alone (None if the codec
/// fails).
pub fn compress(codec: &Codec, data: &[u8], itemsize: usize) -> Option<Vec<u8>> {
    match *codec {
        Codec::Gzip(l) => {
            let mut e = flate2::write::ZlibEncoder::new(
                Vec::with_capacity(data.len() / 2),
                flate2::Compression::new(l),
            );
            e.write_all(data).and_then(|_| e.finish()).ok()
        }
        Codec::Zstd(l) => zstd::bulk::compress(data, l).ok(),
        Codec::Lz4 => Some(lz4_frame(data)),
        Codec::Blosc(b) => Some(blosc_chunk(b, data, itemsize)),
    }
}

/// The type size a Blosc header records: the element size, or 1 past c-blosc's 255.
fn blosc_typesize(itemsize: usize) -> u8 {
    u8::try_from(itemsize).ok().filter(|&t| t > 0).unwrap_or(1)
}

/// A c-blosc 1.x chunk (format 2, what hdf5plugin's Blosc filter and numcodecs read):
/// the 16-byte header, each block's start, then each block as one stream (never split
/// into per-byte streams: flag 0x10), stored raw where compression does not shrink it.
/// A chunk that would not shrink as a whole is stored copied (flag 0x02). Blocks are
/// multiples of 8 elements so bit shuffle covers every full block.
fn blosc_chunk(b: Blosc, data: &[u8], itemsize: usize) -> Vec<u8> {
    let ts = blosc_typesize(itemsize) as usize;
    let nbytes = data.len();
    let target = match b.cname {
        BloscName::Lz4 | BloscName::Blosclz => 64 << 10,
        _ => 256 << 10,
    };
    let unit = 8 * ts;
    let bsize = if nbytes <= target || nbytes < unit {
        nbytes
    } else {
        target / unit * unit
    }
    .max(1);
    let header = |flags: u8, cbytes: usize| {
        let mut h = vec![2u8, 1, flags, ts as u8];
        for v in [nbytes, bsize, cbytes] {
            h.extend_from_slice(&(v as u32).to_le_bytes());
        }
        h
    };
    let copied = || {
        let mut out = header(0x02 | 0x10 | (b.cname.format() << 5), nbytes + 16);
        out.extend_from_slice(data);
        out
    };
    if b.clevel == 0 || nbytes == 0 || nbytes > i32::MAX as usize - 1024 {
        return copied();
    }
    let nblocks = nbytes.div_ceil(bsize);
    let flags = 0x10
        | (b.cname.format() << 5)
        | match b.shuffle {
            1 if ts > 1 => 0x01,
            2 => 0x04,
            _ => 0,
        };
    let mut out = header(flags, 0);
    out.resize(16 + 4 * nblocks, 0);
    let mut tmp = vec![0u8; bsize];
    for (j, block) in data.chunks(bsize).enumerate() {
        let start = out.len() as u32;
        out[16 + 4 * j..20 + 4 * j].copy_from_slice(&start.to_le_bytes());
        let src: &[u8] = if flags & 0x01 != 0 {
            shuffle_into(block, ts, &mut tmp[..block.len()]);
            &tmp[..block.len()]
        } else if flags & 0x04 != 0 && block.len() >= ts && (block.len() / ts) % 8 == 0 {
            let n = block.len() / ts;
            bitshuffle_into(block, n, ts, &mut tmp[..block.len()]);
            tmp[n * ts..block.len()].copy_from_slice(&block[n * ts..]);
            &tmp[..block.len()]
        } else {
            block
        };
        let c = blosc_stream(b, src).filter(|c| !c.is_empty() && c.len() < src.len());
        let stored = c.as_deref().unwrap_or(src);
        out.extend_from_slice(&(stored.len() as u32).to_le_bytes());
        out.extend_from_slice(stored);
        if out.len() > nbytes + 16 {
            return copied();
        }
    }
    let cbytes = out.len() as u32;
    out[12..16].copy_from_slice(&cbytes.to_le_bytes());
    out
}

/// One block through Blosc's inner codec (None when it fails or cannot shrink it).
fn blosc_stream(b: Blosc, src: &[u8]) -> Option<Vec<u8>> {
    match b.cname {
        BloscName::Lz4 => crate::ckernels::lz4_compress(src),
        BloscName::Lz4hc => crate::ckernels::lz4hc_compress(src, b.clevel),
        BloscName::Blosclz => crate::ckernels::blosclz(src, b.clevel),
        // a zlib stream, as HDF5's deflate filter writes one
        BloscName::Zlib => compress(&Codec::Gzip(b.clevel.into()), src, 1),
        // c-blosc maps its level 1-9 onto zstd's 1-22 as clevel * 2 - 1 (9 -> 22)
        BloscName::Zstd => {
            let l = if b.clevel >= 9 {
                22
            } else {
                i32::from(b.clevel) * 2 - 1
            };
            zstd::bulk::compress(src, l).ok()
        }
    }
}

/// [`shuffle`] into `out` (same length as `data`): c-blosc2's SIMD kernel, else
/// [`shuffle_rust`].
fn shuffle_into(data: &[u8], es: usize, out: &mut [u8]) {
    if !crate::ckernels::shuffle_simd(data, es, out) {
        shuffle_rust(data, es, out)
    }
}

/// [`shuffle_into`] in Rust: the fallback, and the reference its tests compare with.
pub(crate) fn shuffle_rust(data: &[u8], es: usize, out: &mut [u8]) {
    let n = data.len() / es;
    for (j, plane) in out[..n * es]
        .chunks_exact_mut(n.max(1))
        .take(es)
        .enumerate()
    {
        for (i, b) in plane.iter_mut().enumerate() {
            *b = data[i * es + j];
        }
    }
    out[n * es..].copy_from_slice(&data[n * es..]);
}

/// Bit shuffle of `n` elements (a multiple of 8) of `es` bytes, the inverse of
/// [`super::shuffle::bitunshuffle_scalar`]: for each byte of the element, its 8 bit
/// planes of n/8 bytes each (one 8x8 bit transpose per 8 elements).
pub fn bitshuffle_into(src: &[u8], n: usize, es: usize, out: &mut [u8]) {
    let nrow = n / 8;
    for j in 0..es {
        for g in 0..nrow {
            let o = g * 8 * es + j;
            let mut x = 0u64;
            for k in 0..8 {
                x |= (src[o + k * es] as u64) << (8 * k);
            }
            let x = super::shuffle::transpose8(x);
            for k in 0..8 {
                out[(j * 8 + k) * nrow + g] = (x >> (8 * k)) as u8;
            }
        }
    }
}

/// HDF5's byte shuffle: byte `j` of every element, then byte `j + 1`; bytes past the
/// last whole element stay at the end.
pub fn shuffle(data: &[u8], es: usize) -> Vec<u8> {
    if es <= 1 || data.len() < es {
        return data.to_vec();
    }
    let mut out = vec![0u8; data.len()];
    shuffle_into(data, es, &mut out);
    out
}

/// hdf5plugin's LZ4 framing (src/H5Zlz4.c): the decoded size (u64, big-endian), the
/// block size (u32), then each block's stored size (u32) and bytes; a block LZ4 would
/// not shrink is stored as it is (its stored size then equals its decoded size).
fn lz4_frame(data: &[u8]) -> Vec<u8> {
    const BLOCK: usize = 1 << 30;
    let bs = data.len().clamp(1, BLOCK);
    let mut out = Vec::with_capacity(data.len() / 2 + 16);
    out.extend_from_slice(&(data.len() as u64).to_be_bytes());
    out.extend_from_slice(&(bs as u32).to_be_bytes());
    for b in data.chunks(bs) {
        let c = crate::ckernels::lz4_compress(b).unwrap_or_default();
        let stored = if !c.is_empty() && c.len() < b.len() {
            &c[..]
        } else {
            b
        };
        out.extend_from_slice(&(stored.len() as u32).to_be_bytes());
        out.extend_from_slice(stored);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(n: usize) -> Vec<u8> {
        (0..n as u32)
            .flat_map(|i| ((i / 7) as f32).to_le_bytes())
            .collect()
    }

    /// Zarr's gzip member, Zstandard frame and Blosc chunk decode to the chunk; a stream that is
    /// corrupt, cut short, or decodes to more or fewer bytes than the chunk is refused.
    #[test]
    fn zarr_chunks_decode_bounded_by_the_chunk() {
        let data = sample(1000);
        let mut g = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(5));
        g.write_all(&data).unwrap();
        let gz = g.finish().unwrap();
        let zs = zstd::bulk::compress(&data, 0).unwrap();
        let bl = Codec::Blosc(Blosc::default());
        let bs = encode_zarr(&bl, &data, 4).unwrap();
        for (codec, enc) in [(Codec::Gzip(5), &gz), (Codec::Zstd(3), &zs), (bl, &bs)] {
            assert_eq!(decode_zarr(&codec, enc, data.len()).unwrap(), data);
            let again = encode_zarr(&codec, &data, 4).unwrap();
            assert_eq!(decode_zarr(&codec, &again, data.len()).unwrap(), data);
            assert!(decode_zarr(&codec, enc, data.len() - 1).is_err());
            assert!(decode_zarr(&codec, enc, data.len() + 4).is_err());
            assert!(decode_zarr(&codec, &enc[..enc.len() / 2], data.len()).is_err());
            let mut bad = enc.clone();
            let n = bad.len();
            bad[n / 2..].iter_mut().for_each(|b| *b ^= 0x5a);
            assert!(decode_zarr(&codec, &bad, data.len()).is_err());
            assert!(decode_zarr(&codec, b"not compressed", data.len()).is_err());
            assert!(decode_zarr(&codec, &[], data.len()).is_err());
        }
    }

    /// Every codec's output decodes back with the decoders the read view uses (the
    /// same formats hdf5plugin reads), shuffled or not.
    #[test]
    fn encoded_chunks_decode_with_the_read_views_decoders() {
        let data = sample(4096);
        for codec in [
            Codec::Gzip(4),
            Codec::Zstd(3),
            Codec::Lz4,
            Codec::Blosc(Blosc::default()),
        ] {
            for sh in [false, true] {
                let c = Compression {
                    codec: codec.clone(),
                    shuffle: sh,
                };
                let (enc, mask) = c.encode(&data, 4);
                assert_eq!(mask, 0, "{codec:?}");
                assert!(enc.len() < data.len());
                let dec = match codec {
                    Codec::Gzip(_) => super::super::hdf5::inflate_bounded(&enc, data.len()),
                    Codec::Zstd(_) => super::super::zstd_filter(&enc, data.len()),
                    Codec::Lz4 => super::super::lz4_filter(&enc, data.len()),
                    Codec::Blosc(_) => super::super::filters::blosc(&enc, data.len()),
                }
                .unwrap();
                let dec = if sh {
                    super::super::unshuffle(&dec, 4)
                } else {
                    dec
                };
                assert_eq!(dec, data, "{codec:?} shuffle {sh}");
            }
        }
    }

    /// Blosc chunks of every compressor and shuffle, element size and length (a last
    /// block shorter than the others, fewer bytes than one element, one of 8 elements
    /// bit-shuffled) decode back with the read view's Blosc decoder; level 0 and data
    /// that does not shrink are stored copied.
    #[test]
    fn blosc_chunks_decode_with_the_read_views_decoder() {
        for cname in BloscName::ALL {
            for shuffle in 0..=2u8 {
                for (len, es) in [
                    (300_000usize, 4usize),
                    (4096, 8),
                    (70_001, 1),
                    (3, 4),
                    (24, 3),
                ] {
                    let data: Vec<u8> = sample(len.div_ceil(4)).into_iter().take(len).collect();
                    let b = Blosc {
                        cname,
                        clevel: 5,
                        shuffle,
                    };
                    let enc = compress(&Codec::Blosc(b), &data, es).unwrap();
                    let dec = crate::codecs::filters::blosc(&enc, data.len()).unwrap();
                    assert_eq!(dec, data, "{cname:?} shuffle {shuffle} len {len} es {es}");
                    if len > 4096 {
                        assert!(enc.len() < data.len() / 2, "{cname:?} {shuffle} {len}");
                    }
                }
            }
        }
        let data = sample(1000);
        let b = Blosc {
            clevel: 0,
            ..Blosc::default()
        };
        let enc = compress(&Codec::Blosc(b), &data, 4).unwrap();
        assert_eq!((enc.len(), enc[2] & 0x02), (data.len() + 16, 0x02));
        assert_eq!(
            crate::codecs::filters::blosc(&enc, data.len()).unwrap(),
            data
        );
    }

    /// Bit shuffle is the exact inverse of the read view's bit unshuffle.
    #[test]
    fn bitshuffle_inverts_bitunshuffle() {
        for es in [1usize, 2, 4, 8, 3] {
            let n = 64;
            let data: Vec<u8> = (0..n * es).map(|i| (i * 37 % 251) as u8).collect();
            let mut sh = vec![0u8; data.len()];
            bitshuffle_into(&data, n, es, &mut sh);
            let mut back = vec![0u8; data.len()];
            super::super::shuffle::bitunshuffle_scalar(&sh, n, es, &mut back);
            assert_eq!(back, data, "es {es}");
        }
    }

    /// Blosc's options as meta.json takes them: a level, hdf5plugin.Blosc's arguments
    /// or its filter options; anything else names what is taken.
    #[test]
    fn blosc_options_parse() {
        let p = |o: Value| Compression::parse(Some(&json!("blosc")), Some(&o), None);
        let b = |c, l, s| {
            Some(Compression {
                codec: Codec::Blosc(Blosc {
                    cname: c,
                    clevel: l,
                    shuffle: s,
                }),
                shuffle: false,
            })
        };
        assert_eq!(p(Value::Null).unwrap(), b(BloscName::Lz4, 5, 1));
        assert_eq!(p(json!(9)).unwrap(), b(BloscName::Lz4, 9, 1));
        assert_eq!(
            p(json!({"cname": "zstd", "clevel": 3, "shuffle": "bitshuffle"})).unwrap(),
            b(BloscName::Zstd, 3, 2)
        );
        assert_eq!(
            p(json!([0, 0, 0, 0, 7, 0, 4])).unwrap(),
            b(BloscName::Zlib, 7, 0)
        );
        assert_eq!(
            Compression::parse(Some(&json!(32001)), None, None).unwrap(),
            b(BloscName::Lz4, 5, 1)
        );
        for bad in [
            json!(10),
            json!({"cname": "snappy"}),
            json!({"level": 3}),
            json!({"shuffle": 3}),
            json!([0, 0, 0, 0, 5, 1, 3]),
            json!([5, 1]),
            json!("fast"),
        ] {
            let e = p(bad.clone()).unwrap_err();
            assert!(e.contains("cname"), "{bad}: {e}");
        }
        let c = p(json!({"cname": "lz4hc"})).unwrap().unwrap();
        assert_eq!(
            c.filters(4, 4096),
            vec![(BLOSC, vec![2, 2, 4, 4096, 5, 1, 2])]
        );
        let (name, opts) = c.to_json();
        assert_eq!(
            Compression::parse(Some(&name), Some(&opts), None).unwrap(),
            Some(c)
        );
    }

    /// Data compression cannot shrink is stored raw, every filter skipped.
    #[test]
    fn incompressible_chunks_are_stored_raw() {
        let mut x: u64 = 0x9e3779b97f4a7c15;
        let data: Vec<u8> = (0..8192)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let c = Compression {
            codec: Codec::Gzip(9),
            shuffle: true,
        };
        assert_eq!(c.encode(&data, 4), (data.clone(), 0b11));
        let c = Compression {
            codec: Codec::Lz4,
            shuffle: false,
        };
        assert_eq!(c.encode(&data, 4), (data, 0b1));
    }

    #[test]
    fn meta_keys_parse_as_h5py_names_them() {
        let p = |c: Value, o: Value, s: Value| Compression::parse(Some(&c), Some(&o), Some(&s));
        assert_eq!(
            p(json!("gzip"), Value::Null, json!(true)).unwrap(),
            Some(Compression {
                codec: Codec::Gzip(4),
                shuffle: true
            })
        );
        assert_eq!(
            p(json!(32015), json!(7), Value::Null)
                .unwrap()
                .unwrap()
                .codec,
            Codec::Zstd(7)
        );
        for bad in [
            (json!("gzip"), json!(10), Value::Null),
            (json!("szip"), Value::Null, Value::Null),
            (json!("lz4"), json!(1), Value::Null),
            (Value::Null, Value::Null, json!(true)),
            (json!("gzip"), Value::Null, json!("yes")),
        ] {
            assert!(
                p(bad.0.clone(), bad.1.clone(), bad.2.clone()).is_err(),
                "{bad:?}"
            );
        }
    }
}
