//! The commit's part for compressed chunked datasets (writer/slots.rs has the file
//! format side): every chunk encoded from the staging file into its slot, in parallel,
//! then the chunk index pointed at the slots and the slots' tails punched out.

use super::base::io;
use super::chunked::Slots;
use crate::codecs::encode::Compression;
use crate::error::{Error, Result};
use crate::writer;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// A compressed dataset the commit stores.
pub(super) struct Compressed {
    pub(super) slots: Slots,
    pub(super) compression: Compression,
    pub(super) itemsize: usize,
    pub(super) chunks: u64,
    pub(super) rank: usize,
}

/// Encodes the `c.chunks` chunks of `staging` (chunk `k` at `k * chunk_bytes`) into
/// their slots of `product`, fsyncs them, then writes the chunk index (`link` names the
/// dataset for a single chunk). Returns the bytes stored.
pub(super) fn store(
    product: &Path,
    staging: &Path,
    link: &str,
    chunk_bytes: u64,
    c: &Compressed,
) -> Result<u64> {
    let src = std::fs::File::open(staging).map_err(io(format!("opening {}", staging.display())))?;
    let dst = std::fs::OpenOptions::new()
        .write(true)
        .open(product)
        .map_err(io(format!("opening {}", product.display())))?;
    let cb = usize::try_from(chunk_bytes).map_err(|_| Error::io("chunk too large"))?;
    if c.slots.index == 0 {
        // one chunk: libhdf5 keeps its stored size in the dataset's header
        let mut buf = vec![0u8; cb];
        src.read_exact_at(&mut buf, 0)
            .map_err(io(format!("reading {}", staging.display())))?;
        let (enc, mask) = c.compression.encode(&buf, c.itemsize);
        writer::chunked::write_single_chunk(product, link, c.rank, &enc, mask)?;
        return Ok(enc.len() as u64);
    }
    let next = AtomicU64::new(0);
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
        .min(usize::try_from(c.chunks).unwrap_or(1))
        .max(1);
    let work = || -> Result<Vec<(u64, u64, u32)>> {
        let mut buf = vec![0u8; cb];
        let mut out = Vec::new();
        loop {
            let k = next.fetch_add(1, Ordering::Relaxed);
            if k >= c.chunks {
                return Ok(out);
            }
            let at = k * chunk_bytes;
            src.read_exact_at(&mut buf, at)
                .map_err(io(format!("reading {}", staging.display())))?;
            let (enc, mask) = c.compression.encode(&buf, c.itemsize);
            let slot = c.slots.base + k * c.slots.slot_bytes;
            dst.write_all_at(&enc, slot).map_err(io(format!(
                "writing a chunk of {link} to {}",
                product.display()
            )))?;
            out.push((k, enc.len() as u64, mask));
        }
    };
    let parts: Vec<Result<Vec<(u64, u64, u32)>>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads).map(|_| s.spawn(work)).collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::io("a chunk encoder panicked")))
            })
            .collect()
    });
    let mut entries = vec![(0u64, 0u64, 0u32); usize::try_from(c.chunks).unwrap_or(0)];
    for p in parts {
        for (k, len, mask) in p? {
            entries[k as usize] = (c.slots.base + k * c.slots.slot_bytes, len, mask);
        }
    }
    // the chunks are durable before the index that points at them
    dst.sync_data()
        .map_err(io(format!("fsync {}", product.display())))?;
    writer::slots::patch_index(product, c.slots.index, &entries)?;
    let mut stored = 0;
    for &(at, len, _) in &entries {
        writer::slots::punch(&dst, at + len, at + c.slots.slot_bytes);
        stored += len;
    }
    Ok(stored)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codecs::encode::Codec;

    /// The layout end to end against libhdf5 itself: a dataset declared with a
    /// pipeline, its chunks encoded into slots and the index pointed at them, reads back
    /// through libhdf5 (h5py's path) as the tiles written; a chunk that does not
    /// compress is stored raw. Both index forms: one data block, and paged (over 1 024
    /// chunks), and the single-chunk index.
    #[test]
    fn compressed_chunks_read_back_through_libhdf5() {
        crate::h5::zfilters::register();
        let dir = tempfile::tempdir().unwrap();
        type Case = (&'static str, Vec<u64>, Vec<u64>, Codec, bool);
        let cases: [Case; 5] = [
            ("<f4", vec![200, 100], vec![64, 48], Codec::Gzip(4), true),
            ("<i2", vec![2100], vec![1], Codec::Zstd(3), false),
            ("<f8", vec![33, 17], vec![8, 16], Codec::Lz4, true),
            ("<u4", vec![3000], vec![2], Codec::Gzip(1), false),
            ("<f4", vec![40, 30], vec![40, 30], Codec::Zstd(1), true),
        ];
        for (i, (dt, shape, chunk, codec, shuffle)) in cases.into_iter().enumerate() {
            let p = dir.path().join(format!("c{i}.h5"));
            let z = Compression { codec, shuffle };
            let itemsize: usize = dt[2..].parse().unwrap();
            let filters = z.filters(itemsize as u32);
            let a = writer::chunked::add_dataset(
                &p,
                true,
                "/h/d",
                dt,
                &shape,
                &chunk,
                &serde_json::Value::Null,
                &filters,
            )
            .unwrap();
            let grid: Vec<u64> = shape
                .iter()
                .zip(&chunk)
                .map(|(s, c)| s.div_ceil(*c))
                .collect();
            let n: u64 = grid.iter().product();
            let index = if n > 1 {
                let eoa = writer::slots::end_of_file(&p).unwrap();
                writer::slots::find_index(&p, 0, eoa, n, a.base).unwrap()
            } else {
                0
            };
            let slot_bytes = a.chunk_bytes.next_multiple_of(4096);
            let base = writer::slots::reserve_tail(&p, n * slot_bytes, 4096).unwrap();
            // the staging file: chunk k holds bytes of value f(k, j), the last chunk noise
            let staging = dir.path().join(format!("c{i}.tiles"));
            let mut bytes = Vec::new();
            let mut x: u32 = 12345;
            for k in 0..n {
                for j in 0..a.chunk_bytes {
                    bytes.push(if k == n - 1 && n > 1 {
                        x = x.wrapping_mul(1664525).wrapping_add(1013904223);
                        (x >> 24) as u8
                    } else {
                        ((k + j / 64) % 251) as u8
                    });
                }
            }
            std::fs::write(&staging, &bytes).unwrap();
            let c = Compressed {
                slots: Slots {
                    staging: String::new(),
                    base,
                    slot_bytes,
                    index,
                },
                compression: z,
                itemsize,
                chunks: n,
                rank: shape.len(),
            };
            let stored = store(&p, &staging, "/h/d", a.chunk_bytes, &c).unwrap();
            assert!(stored > 0);
            let f = hdf5::File::open(&p).unwrap();
            let d = f.dataset("/h/d").unwrap();
            // read as the file type (no conversion), compared as bytes
            let got: Vec<u8> = match dt {
                "<i2" => d
                    .read_raw::<i16>()
                    .unwrap()
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
                "<f4" => d
                    .read_raw::<f32>()
                    .unwrap()
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
                "<u4" => d
                    .read_raw::<u32>()
                    .unwrap()
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
                _ => d
                    .read_raw::<f64>()
                    .unwrap()
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
            };
            // the expected array: each chunk's bytes placed at its region (edges clipped)
            let mut want = vec![0u8; got.len()];
            let strides: Vec<u64> = (0..shape.len())
                .map(|d| shape[d + 1..].iter().product())
                .collect();
            let cstr: Vec<u64> = (0..chunk.len())
                .map(|d| chunk[d + 1..].iter().product())
                .collect();
            let nel: u64 = shape.iter().product();
            for e in 0..nel {
                let mut rest = e;
                let (mut k, mut w) = (0u64, 0u64);
                for d in 0..shape.len() {
                    let idx = rest / strides[d];
                    rest %= strides[d];
                    k = k * grid[d] + idx / chunk[d];
                    w += (idx % chunk[d]) * cstr[d];
                }
                let src = (k * a.chunk_bytes + w * itemsize as u64) as usize;
                let dst = (e * itemsize as u64) as usize;
                want[dst..dst + itemsize].copy_from_slice(&bytes[src..src + itemsize]);
            }
            // (compared as bit patterns: NaN bytes included)
            // (compared as bit patterns: NaN bytes included)
            assert!(got == want, "case {i}");
            if n > 1 {
                // the noise chunk is raw, every filter skipped
                let info = d.chunk_info(n as usize - 1).unwrap();
                assert_eq!(info.filter_mask, (1 << filters.len()) - 1, "case {i}");
                assert_eq!(info.size, a.chunk_bytes);
                assert_eq!(info.addr, base + (n - 1) * slot_bytes);
            }
        }
    }
}
