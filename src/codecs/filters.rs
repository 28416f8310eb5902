//! The framing of hdf5plugin's and h5py's filters: LZ4, Zstandard, BZip2, Bitshuffle
//! and Blosc (1.x) chunks.

use super::blocks::{lz4_block, read_bounded, zlib_block, zstd_into};
use super::lz77::blosclz;
use super::shuffle::{bitunshuffle, unshuffle_into};
use super::{be32, be64, corrupt, le32, too_large, Failure, Out};

/// The HDF5 LZ4 filter (32004): u64 BE decoded size, u32 BE block size, then per block a
/// u32 BE stored size and the LZ4 block (stored raw when that size equals the block's).
pub fn lz4_filter(input: &[u8], cap: usize) -> Out {
    let (Some(total), Some(bs)) = (be64(input, 0), be32(input, 8)) else {
        return corrupt("LZ4 chunk shorter than its 12-byte header");
    };
    if total > cap as u64 {
        return too_large("LZ4", total, cap);
    }
    let total = total as usize;
    let bs = (bs as usize).min(total);
    if bs == 0 && total > 0 {
        return corrupt("LZ4 chunk with a block size of 0");
    }
    let mut out = vec![0u8; total];
    let mut ip = 12usize;
    let mut op = 0usize;
    while op < total {
        let this = bs.min(total - op);
        let Some(cs) = be32(input, ip) else {
            return corrupt("LZ4 block header past the end of the stored chunk");
        };
        ip += 4;
        let cs = cs as usize;
        let Some(src) = input.get(ip..ip.saturating_add(cs)) else {
            return corrupt("LZ4 block past the end of the stored chunk");
        };
        let dst = &mut out[op..op + this];
        if cs == this {
            dst.copy_from_slice(src);
        } else {
            lz4_block(src, dst)?;
        }
        ip += cs;
        op += this;
    }
    Ok(out)
}

/// The Zstandard filter (32015): one Zstandard frame.
pub fn zstd_filter(input: &[u8], cap: usize) -> Out {
    match zstd::zstd_safe::get_frame_content_size(input) {
        Ok(Some(n)) if n > cap as u64 => too_large("Zstandard", n, cap),
        Ok(Some(n)) => {
            let mut out = vec![0u8; n as usize];
            zstd_into(input, &mut out)?;
            Ok(out)
        }
        // Size not recorded (a streamed frame): decode at most cap + 1 bytes.
        Ok(None) => {
            let d = zstd::stream::read::Decoder::new(input)
                .map_err(|e| Failure::Corrupt(format!("Zstandard frame is corrupt: {e}")))?;
            read_bounded(d, cap, "Zstandard")
        }
        Err(_) => corrupt("Zstandard frame header is corrupt"),
    }
}

/// The BZip2 filter (307): one bzip2 stream.
pub fn bzip2_filter(input: &[u8], cap: usize) -> Out {
    read_bounded(bzip2::read::BzDecoder::new(input), cap, "bzip2")
}

/// Bitshuffle's default block (bshuf_default_block_size): about 8 KiB of elements, a
/// multiple of 8, at least 128.
pub(super) fn bshuf_default_block(es: usize) -> usize {
    ((8192 / es) / 8 * 8).max(128)
}

/// The Bitshuffle filter (32008). cd_values: [2] element size, [3] block size in
/// elements (0: default), [4] 0 none, 2 LZ4, 3 Zstandard. Compressed chunks start with
/// a u64 BE decoded size and a u32 BE block size in bytes; then each block is a u32 BE
/// stored size and the compressed bit-transposed block. Blocks hold `block` elements,
/// the last one the rest rounded down to a multiple of 8; the last `n % 8` elements
/// follow as they are.
pub fn bitshuffle_filter(input: &[u8], cd: &[u32], elem: usize, cap: usize) -> Out {
    let es = cd.get(2).map_or(elem, |&v| v as usize);
    if es == 0 {
        return corrupt("Bitshuffle element size of 0");
    }
    let comp = cd.get(4).copied().unwrap_or(0);
    let (total, block, mut ip) = match comp {
        0 => {
            let b = match cd.get(3) {
                Some(&b) if b != 0 => b as usize,
                _ => bshuf_default_block(es),
            };
            (input.len() as u64, b, 0usize)
        }
        2 | 3 => {
            let (Some(total), Some(bb)) = (be64(input, 0), be32(input, 8)) else {
                return corrupt("Bitshuffle chunk shorter than its 12-byte header");
            };
            (total, bb as usize / es, 12)
        }
        c => return corrupt(format!("Bitshuffle compression {c} is not known")),
    };
    if total > cap as u64 {
        return too_large("Bitshuffle", total, cap);
    }
    let total = total as usize;
    if total % es != 0 {
        return corrupt(format!(
            "Bitshuffle chunk of {total} bytes is not a whole number of {es}-byte elements"
        ));
    }
    if block == 0 || block % 8 != 0 {
        return corrupt(format!(
            "Bitshuffle block of {block} elements is not a positive multiple of 8"
        ));
    }
    let n = total / es;
    let mut out = vec![0u8; total];
    let mut tmp = vec![0u8; block.min(n).saturating_mul(es)];
    let last = n % block - n % block % 8;
    let blocks = std::iter::repeat_n(block, n / block).chain((last > 0).then_some(last));
    let mut op = 0usize;
    for b in blocks {
        let bytes = b * es;
        let t = &mut tmp[..bytes];
        if comp == 0 {
            let Some(src) = input.get(ip..ip + bytes) else {
                return corrupt("Bitshuffle block past the end of the stored chunk");
            };
            t.copy_from_slice(src);
            ip += bytes;
        } else {
            let Some(cs) = be32(input, ip) else {
                return corrupt("Bitshuffle block header past the end of the stored chunk");
            };
            ip += 4;
            let Some(src) = input.get(ip..ip.saturating_add(cs as usize)) else {
                return corrupt("Bitshuffle block past the end of the stored chunk");
            };
            ip += cs as usize;
            if comp == 3 {
                zstd_into(src, t)?;
            } else {
                lz4_block(src, t)?;
            }
        }
        bitunshuffle(t, b, es, &mut out[op..op + bytes]);
        op += bytes;
    }
    let rest = total - op;
    let Some(src) = input.get(ip..ip + rest) else {
        return corrupt("Bitshuffle trailing elements past the end of the stored chunk");
    };
    out[op..].copy_from_slice(src);
    Ok(out)
}

/// Blosc (c-blosc 1.x) chunks, the Blosc filter's (32001) format: a 16-byte header
/// (version, codec version, flags, type size, u32 LE decoded size, block size, stored
/// size), the u32 LE start of each block, then each block as one stream or `typesize`
/// streams (u32 LE size + data; stored raw when the size is the stream's), followed by
/// the block's byte or bit unshuffle.
pub fn blosc(input: &[u8], cap: usize) -> Out {
    if input.len() < 16 {
        return corrupt("Blosc chunk shorter than its 16-byte header");
    }
    let (version, flags, ts) = (input[0], input[2], input[3] as usize);
    let nbytes = le32(input, 4).unwrap_or(0) as usize;
    let bsize = le32(input, 8).unwrap_or(0) as usize;
    let cbytes = le32(input, 12).unwrap_or(0) as usize;
    if nbytes as u64 > cap as u64 {
        return too_large("Blosc", nbytes as u64, cap);
    }
    if nbytes == 0 {
        return Ok(Vec::new());
    }
    if version == 0 || version > 2 || flags & 0x08 != 0 {
        return corrupt(format!(
            "Blosc format version {version} (flags {flags:#x}) is not Blosc 1 \
             (a newer Blosc wrote it?)"
        ));
    }
    if ts == 0 || bsize == 0 || bsize > cap.max(nbytes) || cbytes > input.len() {
        return corrupt("Blosc header is corrupt");
    }
    let src = &input[..cbytes];
    let mut out = vec![0u8; nbytes];
    if flags & 0x02 != 0 {
        if cbytes != nbytes + 16 {
            return corrupt("Blosc copied chunk has the wrong size");
        }
        out.copy_from_slice(&src[16..]);
        return Ok(out);
    }
    let nblocks = nbytes.div_ceil(bsize);
    if nblocks > (cbytes - 16) / 4 {
        return corrupt("Blosc block table past the end of the stored chunk");
    }
    let codec = flags >> 5;
    let doshuffle = flags & 0x01 != 0 && ts > 1;
    let dobitshuffle = flags & 0x04 != 0;
    let dont_split = flags & 0x10 != 0;
    let mut snappy = snap::raw::Decoder::new();
    let mut tmp: Vec<u8> = Vec::with_capacity(bsize);
    for j in 0..nblocks {
        let start = j * bsize;
        let this = bsize.min(nbytes - start);
        let leftover = this < bsize;
        let Some(mut so) = le32(src, 16 + 4 * j).map(|v| v as usize) else {
            return corrupt("Blosc block table is corrupt");
        };
        let nsplits = if !dont_split && ts <= 16 && this / ts >= 128 && !leftover {
            ts
        } else {
            1
        };
        let neblock = this / nsplits;
        tmp.clear();
        for _ in 0..nsplits {
            let Some(cs) = le32(src, so).map(|v| v as usize) else {
                return corrupt("Blosc stream header past the end of the stored chunk");
            };
            so += 4;
            let Some(s) = src.get(so..so.saturating_add(cs)) else {
                return corrupt("Blosc stream past the end of the stored chunk");
            };
            so += cs;
            if cs == neblock {
                tmp.extend_from_slice(s);
                continue;
            }
            if codec == 0 {
                blosclz(s, neblock, &mut tmp)?;
                continue;
            }
            let at = tmp.len();
            tmp.resize(at + neblock, 0);
            let dst = &mut tmp[at..];
            match codec {
                1 => lz4_block(s, dst)?,
                2 => match snappy.decompress(s, dst) {
                    Ok(n) if n == neblock => {}
                    _ => return corrupt("Snappy stream in a Blosc block is corrupt"),
                },
                3 => zlib_block(s, dst)?,
                4 => zstd_into(s, dst)?,
                c => return corrupt(format!("Blosc codec {c} is not known")),
            }
        }
        // Splits may cover less than the block when it is not a multiple of typesize.
        if tmp.len() != this {
            return corrupt("Blosc block does not decode to its size");
        }
        let dst = &mut out[start..start + this];
        if doshuffle {
            unshuffle_into(&tmp, ts, dst);
        } else if dobitshuffle && this >= ts && (this / ts) % 8 == 0 {
            let n = this / ts;
            bitunshuffle(&tmp, n, ts, dst);
            dst[n * ts..].copy_from_slice(&tmp[n * ts..]);
        } else {
            dst.copy_from_slice(&tmp);
        }
    }
    Ok(out)
}

/// One gzip member (RFC 1952), as Zarr's `gzip` codec writes a chunk; bytes after the
/// member are ignored, as HDF5's deflate ignores bytes after its zlib stream.
pub fn gzip_member(input: &[u8], cap: usize) -> Out {
    read_bounded(flate2::read::GzDecoder::new(input), cap, "gzip")
}
