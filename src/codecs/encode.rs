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

pub use super::{DEFLATE, LZ4, SHUFFLE, ZSTD};

/// The codec of a compressed chunked dataset.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Codec {
    /// zlib stream at this level (0-9; h5py's default 4).
    Gzip(u32),
    /// Zstandard frame at this level (hdf5plugin's default 3).
    Zstd(i32),
    /// hdf5plugin's LZ4 framing: one block per chunk.
    Lz4,
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
                        "\"shuffle\" and \"compression_opts\" need a \"compression\" (gzip, zstd or lz4)"
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
            "blosc" => {
                return Err(
                    "\"compression\": \"blosc\" is not written yet: use gzip, zstd or lz4".into(),
                )
            }
            other => {
                return Err(format!(
                    "\"compression\" {other:?} is not one the mount writes: use gzip, zstd or lz4"
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
        }
    }

    /// The HDF5 pipeline, as h5py and hdf5plugin write it: shuffle (its client data
    /// the element size) before the codec.
    pub fn filters(&self, itemsize: u32) -> Vec<FilterSpec> {
        let mut f = Vec::new();
        if self.shuffle {
            f.push((SHUFFLE, vec![itemsize]));
        }
        f.push(match self.codec {
            Codec::Gzip(l) => (DEFLATE, vec![l]),
            // the level as an unsigned int, as hdf5plugin stores it
            Codec::Zstd(l) => (ZSTD, vec![l as u32]),
            Codec::Lz4 => (LZ4, vec![0]),
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
        match compress(&self.codec, data) {
            Some(o) if o.len() < chunk.len() => (o, 0),
            _ => (chunk.to_vec(), (1u32 << nfilters) - 1),
        }
    }
}

/// The Zarr v3 codec (after `bytes`) that stores chunks as this compression does, if
/// Zarr has one: zstd or gzip without shuffle. A pending dataset's Zarr view shows it
/// and serves and takes its chunks encoded with it; otherwise chunks are raw bytes.
pub fn zarr_codec(c: &Compression) -> Option<Value> {
    match (&c.codec, c.shuffle) {
        (Codec::Zstd(l), false) => {
            Some(json!({"name": "zstd", "configuration": {"level": l, "checksum": false}}))
        }
        (Codec::Gzip(l), false) => Some(json!({"name": "gzip", "configuration": {"level": l}})),
        _ => None,
    }
}

/// A chunk as Zarr's codec of the same name writes it (a gzip member, a Zstandard
/// frame), for a pending chunk read through the Zarr view.
pub fn encode_zarr(codec: &Codec, data: &[u8]) -> Option<Vec<u8>> {
    match *codec {
        Codec::Gzip(l) => {
            let mut e = flate2::write::GzEncoder::new(
                Vec::with_capacity(data.len() / 2),
                flate2::Compression::new(l),
            );
            e.write_all(data).and_then(|_| e.finish()).ok()
        }
        Codec::Zstd(l) => zstd::bulk::compress(data, l).ok(),
        Codec::Lz4 => None,
    }
}

/// A chunk Zarr's codec of the same name wrote (a gzip member, a Zstandard frame),
/// decoded back to the chunk's bytes: at most `cap` bytes are produced, whatever sizes
/// the stream declares, and a stream that decodes to fewer is refused as well (a Zarr
/// chunk is always whole, an edge chunk padded).
pub fn decode_zarr(codec: &Codec, input: &[u8], cap: usize) -> super::Out {
    let out = match codec {
        Codec::Gzip(_) => super::gzip_member(input, cap)?,
        Codec::Zstd(_) => super::zstd_filter(input, cap)?,
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

/// `data` through `codec` alone (None if the codec fails).
pub fn compress(codec: &Codec, data: &[u8]) -> Option<Vec<u8>> {
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
    }
}

/// HDF5's byte shuffle: byte `j` of every element, then byte `j + 1`; bytes past the
/// last whole element stay at the end.
pub fn shuffle(data: &[u8], es: usize) -> Vec<u8> {
    if es <= 1 || data.len() < es {
        return data.to_vec();
    }
    let n = data.len() / es;
    let mut out = vec![0u8; data.len()];
    for (j, plane) in out[..n * es].chunks_exact_mut(n).enumerate() {
        for (i, b) in plane.iter_mut().enumerate() {
            *b = data[i * es + j];
        }
    }
    out[n * es..].copy_from_slice(&data[n * es..]);
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

    /// Zarr's gzip member and Zstandard frame decode to the chunk; a stream that is
    /// corrupt, cut short, or decodes to more or fewer bytes than the chunk is refused.
    #[test]
    fn zarr_chunks_decode_bounded_by_the_chunk() {
        let data = sample(1000);
        let mut g = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(5));
        g.write_all(&data).unwrap();
        let gz = g.finish().unwrap();
        let zs = zstd::bulk::compress(&data, 0).unwrap();
        for (codec, enc) in [(Codec::Gzip(5), &gz), (Codec::Zstd(3), &zs)] {
            assert_eq!(decode_zarr(&codec, enc, data.len()).unwrap(), data);
            let again = encode_zarr(&codec, &data).unwrap();
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
        for codec in [Codec::Gzip(4), Codec::Zstd(3), Codec::Lz4] {
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
            (json!("blosc"), Value::Null, Value::Null),
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
