//! The filter pipeline of a stored chunk, run backwards: HDF5's own filters (deflate,
//! shuffle, Fletcher-32) here, the others through the codecs.

use crate::codecs;
use crate::h5::FilterInfo;
use std::io::Read;

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
}
