//! The filter pipeline of a stored chunk, run backwards through the codec registry
//! (`codecs::filter`).

use crate::codecs::{self, Params};
use crate::h5::FilterInfo;

pub use crate::codecs::{fletcher32, unshuffle, Failure};
pub use crate::h5::MAX_CELL_BYTES;

/// Whether every filter of the pipeline has a Rust decoder.
pub fn rust_decodable(filters: &[FilterInfo]) -> bool {
    filters.iter().all(|f| codecs::builtin(f.id))
}

/// Whether libhdf5 may decode a chunk our decoders found corrupt: it has every filter
/// of the pipeline, and no decoder of ours says its verdict must stand.
pub fn hdf5_may_retry(filters: &[FilterInfo]) -> bool {
    filters
        .iter()
        .all(|f| f.hdf5 && codecs::filter(f.id).is_none_or(|c| c.hdf5_may_retry()))
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
        let sums = (0..i)
            .filter(|&j| active(j) && filters[j].id == codecs::FLETCHER32)
            .count();
        let cap = expect.saturating_add(4 * sums);
        let Some(codec) = codecs::filter(f.id) else {
            return Err(Failure::Corrupt(format!(
                "{} filter: filter {} has no Rust decoder",
                f.name, f.id
            )));
        };
        let params = Params {
            cd: &f.cd_values,
            elem,
        };
        buf = codec.decode(buf, &params, cap)?;
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

    /// What zlib's `inflate` does with HDF5 deflate chunks, libdeflate does too: bytes
    /// after the stream are ignored, a wrong Adler-32 or a cut stream is corrupt.
    #[test]
    fn deflate_trailing_bytes_checksum_and_cut_streams() {
        let data: Vec<u8> = (0..50_000u32).map(|v| (v % 251) as u8).collect();
        let mut enc = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::new(6));
        enc.write_all(&data).unwrap();
        let z = enc.finish().unwrap();
        let mut padded = z.clone();
        padded.extend_from_slice(&[0xAB; 37]);
        assert_eq!(
            decode_chunk(padded, &[filter(1)], 0, 1, data.len()),
            Ok(data.clone())
        );
        let mut sum = z.clone();
        let n = sum.len();
        sum[n - 2] ^= 0x40; // inside the Adler-32
        assert!(matches!(
            decode_chunk(sum, &[filter(1)], 0, 1, data.len()),
            Err(Failure::Corrupt(_))
        ));
        let cut = z[..z.len() / 2].to_vec();
        assert!(matches!(
            decode_chunk(cut, &[filter(1)], 0, 1, data.len()),
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
