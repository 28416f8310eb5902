//! HDF5's own filters: deflate (1), shuffle (2) and Fletcher-32 (3).

use super::shuffle::unshuffle_into;
use super::{corrupt, Out};

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
    unshuffle_into(data, es, &mut out);
    out
}

/// Inflates `input` into at most `cap` bytes ([`super::c::zlib_inflate`]); a stream
/// inflating beyond `cap` is refused, so a deflate bomb never costs more than one chunk.
pub(super) fn inflate_bounded(input: &[u8], cap: usize) -> Out {
    super::c::zlib_inflate(input, cap)
}

/// Checks and strips the Fletcher-32 checksum that ends `buf` (either byte order, as
/// HDF5 accepts).
pub(super) fn fletcher32_strip(mut buf: Vec<u8>) -> Out {
    if buf.len() < 4 {
        return corrupt("Fletcher-32 chunk shorter than its checksum");
    }
    let n = buf.len() - 4;
    let stored = u32::from_le_bytes([buf[n], buf[n + 1], buf[n + 2], buf[n + 3]]);
    let sum = fletcher32(&buf[..n]);
    if stored != sum && stored != sum.swap_bytes() {
        return corrupt(format!(
            "Fletcher-32 checksum mismatch (stored {stored:#010x}, computed {sum:#010x})"
        ));
    }
    buf.truncate(n);
    Ok(buf)
}
