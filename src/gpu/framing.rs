//! HDF5 filter framings taken apart on the host, so that a GPU decoder that knows only
//! raw streams can decode the pieces in one batch (issue 32): nvCOMP's Deflate decodes
//! raw RFC 1951 streams (HDF5's deflate filter writes zlib: a 2-byte header, the stream,
//! an Adler-32), and its LZ4 decodes raw blocks (the HDF5 LZ4 filter frames blocks).
//! The parsers read only the framing, bounded by the chunk and by `cap`, and refuse what
//! the host decoders refuse; tests compare the pieces with the host decoders' output.

use crate::codecs::{be32, be64, le32};
use std::ops::Range;

/// One unit of decode work from a chunk: stored bytes `src` of the chunk become decoded
/// bytes `dst` of the chunk's output, by the codec or, when `raw`, by a copy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Piece {
    pub src: Range<usize>,
    pub dst: Range<usize>,
    pub raw: bool,
}

/// Why a chunk's framing was refused (the chunk is corrupt or too large).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused(pub String);

/// A zlib stream (HDF5's deflate filter, id 1): the raw deflate stream's bytes and the
/// Adler-32 of the decoded bytes that the trailer records. Preset dictionaries (never
/// written by HDF5) are refused.
pub fn zlib(chunk: &[u8]) -> Result<(Range<usize>, u32), Refused> {
    if chunk.len() < 6 {
        return Err(Refused(format!(
            "zlib stream of {} bytes, shorter than its header and trailer",
            chunk.len()
        )));
    }
    let (cmf, flg) = (chunk[0], chunk[1]);
    if cmf & 0x0f != 8 || cmf >> 4 > 7 || (u16::from(cmf) << 8 | u16::from(flg)) % 31 != 0 {
        return Err(Refused("not a zlib header".into()));
    }
    if flg & 0x20 != 0 {
        return Err(Refused("zlib stream with a preset dictionary".into()));
    }
    let end = chunk.len() - 4;
    let adler = be32(chunk, end).ok_or_else(|| Refused("zlib trailer".into()))?;
    Ok((2..end, adler))
}

/// The HDF5 LZ4 filter (32004): u64 BE decoded size, u32 BE block size, then per block a
/// u32 BE stored size and the block, stored raw when that size equals the block's (the
/// host decoder's rules, `codecs::lz4_filter`). Returns the decoded size and the blocks.
pub fn lz4(chunk: &[u8], cap: usize) -> Result<(usize, Vec<Piece>), Refused> {
    let (Some(total), Some(bs)) = (be64(chunk, 0), be32(chunk, 8)) else {
        return Err(Refused("LZ4 chunk shorter than its 12-byte header".into()));
    };
    if total > cap as u64 {
        return Err(Refused(format!(
            "LZ4 chunk decodes to {total} bytes, over the {cap}-byte bound"
        )));
    }
    let total = total as usize;
    let bs = (bs as usize).min(total);
    if bs == 0 && total > 0 {
        return Err(Refused("LZ4 chunk with a block size of 0".into()));
    }
    let mut pieces = Vec::with_capacity(total.div_ceil(bs.max(1)));
    let (mut ip, mut op) = (12usize, 0usize);
    while op < total {
        let this = bs.min(total - op);
        let cs = be32(chunk, ip)
            .ok_or_else(|| Refused("LZ4 block header past the end of the stored chunk".into()))?
            as usize;
        ip += 4;
        let end = ip
            .checked_add(cs)
            .filter(|&e| e <= chunk.len())
            .ok_or_else(|| Refused("LZ4 block past the end of the stored chunk".into()))?;
        pieces.push(Piece {
            src: ip..end,
            dst: op..op + this,
            raw: cs == this,
        });
        ip = end;
        op += this;
    }
    Ok((total, pieces))
}

/// A Bitshuffle chunk (32008) with LZ4 or Zstandard blocks, taken apart: each block
/// decodes to bit-transposed bytes that a bit unshuffle of `elems` elements of `es`
/// bytes turns into its part of the output; `tail`, the last `n % 8` elements, is stored
/// as they are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bitshuffled {
    pub total: usize,
    pub es: usize,
    /// 2: LZ4 blocks, 3: Zstandard frames.
    pub codec: u32,
    pub blocks: Vec<(Piece, usize)>,
    pub tail: Piece,
}

/// Parses a Bitshuffle chunk whose blocks are compressed (cd_values [2] element size,
/// [4] 2 or 3), by the host decoder's rules (`codecs::bitshuffle_filter`): a u64 BE
/// decoded size, a u32 BE block size in bytes, then per block a u32 BE stored size and
/// the block. Uncompressed Bitshuffle (cd[4] 0) needs no decoder and is refused here.
pub fn bitshuffle(
    chunk: &[u8],
    cd: &[u32],
    elem: usize,
    cap: usize,
) -> Result<Bitshuffled, Refused> {
    let es = cd.get(2).map_or(elem, |&v| v as usize);
    let codec = cd.get(4).copied().unwrap_or(0);
    if es == 0 || !(codec == 2 || codec == 3) {
        return Err(Refused(format!(
            "Bitshuffle with element size {es} and compression {codec} has no GPU framing"
        )));
    }
    let (Some(total), Some(bb)) = (be64(chunk, 0), be32(chunk, 8)) else {
        return Err(Refused(
            "Bitshuffle chunk shorter than its 12-byte header".into(),
        ));
    };
    if total > cap as u64 {
        return Err(Refused(format!(
            "Bitshuffle chunk decodes to {total} bytes, over the {cap}-byte bound"
        )));
    }
    let (total, block) = (total as usize, bb as usize / es);
    if total % es != 0 || block == 0 || block % 8 != 0 {
        return Err(Refused(format!(
            "Bitshuffle chunk of {total} bytes in blocks of {block} {es}-byte elements"
        )));
    }
    let n = total / es;
    let last = n % block - n % block % 8;
    let sizes = std::iter::repeat_n(block, n / block).chain((last > 0).then_some(last));
    let (mut ip, mut op) = (12usize, 0usize);
    let mut blocks = Vec::with_capacity(n / block + 1);
    for b in sizes {
        let cs = be32(chunk, ip).ok_or_else(|| {
            Refused("Bitshuffle block header past the end of the stored chunk".into())
        })? as usize;
        ip += 4;
        let end = ip
            .checked_add(cs)
            .filter(|&e| e <= chunk.len())
            .ok_or_else(|| Refused("Bitshuffle block past the end of the stored chunk".into()))?;
        let bytes = b * es;
        blocks.push((
            Piece {
                src: ip..end,
                dst: op..op + bytes,
                raw: false,
            },
            b,
        ));
        ip = end;
        op += bytes;
    }
    let rest = total - op;
    if ip.checked_add(rest).is_none_or(|e| e > chunk.len()) {
        return Err(Refused(
            "Bitshuffle trailing elements past the end of the stored chunk".into(),
        ));
    }
    Ok(Bitshuffled {
        total,
        es,
        codec,
        blocks,
        tail: Piece {
            src: ip..ip + rest,
            dst: op..total,
            raw: true,
        },
    })
}

/// What turns a Blosc block's decoded bytes into its output bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unshuffle {
    /// The bytes as they are.
    None,
    /// Byte unshuffle of `typesize`-byte elements.
    Bytes { typesize: usize },
    /// Bit unshuffle of `elems` elements of `typesize` bytes; bytes past them as they are.
    Bits { typesize: usize, elems: usize },
}

/// A Blosc (c-blosc 1.x) chunk taken apart: `streams` decode (or copy, when raw) into a
/// staging image of the chunk's `total` bytes, each block `[start, start + len)` of which
/// then goes to the same bytes of the output through its `unshuffle`. `codec` is the
/// streams' Blosc format: 1 LZ4, 4 Zstandard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bloscd {
    pub total: usize,
    pub codec: u8,
    pub streams: Vec<Piece>,
    pub blocks: Vec<(Range<usize>, Unshuffle)>,
}

/// Parses a Blosc chunk (filter 32001) by the host decoder's rules (`codecs::blosc`).
/// Streams of formats a GPU decoder has no codec for here (BloscLZ, Snappy, zlib) are
/// refused, so the chunk takes the host path; a copied chunk (flag 0x02) is one raw
/// stream.
pub fn blosc(chunk: &[u8], cap: usize) -> Result<Bloscd, Refused> {
    let bad = |why: &str| Err(Refused(format!("Blosc chunk: {why}")));
    if chunk.len() < 16 {
        return bad("shorter than its 16-byte header");
    }
    let le = |at: usize| le32(chunk, at).map(|v| v as usize);
    let (version, flags, ts) = (chunk[0], chunk[2], chunk[3] as usize);
    let (nbytes, bsize, cbytes) = (le(4).unwrap_or(0), le(8).unwrap_or(0), le(12).unwrap_or(0));
    if nbytes > cap {
        return bad(&format!(
            "decodes to {nbytes} bytes, over the {cap}-byte bound"
        ));
    }
    if version == 0 || version > 2 || flags & 0x08 != 0 {
        return bad("not Blosc 1");
    }
    let codec = flags >> 5;
    let whole = Bloscd {
        total: nbytes,
        codec,
        streams: Vec::new(),
        blocks: Vec::new(),
    };
    if nbytes == 0 {
        return Ok(whole);
    }
    if ts == 0 || bsize == 0 || bsize > cap.max(nbytes) || cbytes > chunk.len() {
        return bad("header is corrupt");
    }
    if flags & 0x02 != 0 {
        if cbytes != nbytes + 16 {
            return bad("copied chunk has the wrong size");
        }
        return Ok(Bloscd {
            streams: vec![Piece {
                src: 16..cbytes,
                dst: 0..nbytes,
                raw: true,
            }],
            blocks: vec![(0..nbytes, Unshuffle::None)],
            ..whole
        });
    }
    if codec != 1 && codec != 4 {
        return bad(&format!("stream format {codec} has no GPU decoder here"));
    }
    let nblocks = nbytes.div_ceil(bsize);
    if nblocks > (cbytes - 16) / 4 {
        return bad("block table past the end of the stored chunk");
    }
    let src = &chunk[..cbytes];
    let (doshuffle, dobitshuffle, dont_split) = (
        flags & 0x01 != 0 && ts > 1,
        flags & 0x04 != 0,
        flags & 0x10 != 0,
    );
    let mut streams = Vec::new();
    let mut blocks = Vec::with_capacity(nblocks);
    for j in 0..nblocks {
        let start = j * bsize;
        let this = bsize.min(nbytes - start);
        let leftover = this < bsize;
        let Some(mut so) = le(16 + 4 * j) else {
            return bad("block table is corrupt");
        };
        let nsplits = if !dont_split && ts <= 16 && this / ts >= 128 && !leftover {
            ts
        } else {
            1
        };
        let neblock = this / nsplits;
        if neblock * nsplits != this {
            return bad("block does not decode to its size");
        }
        for k in 0..nsplits {
            let Some(cs) = le32(src, so).map(|v| v as usize) else {
                return bad("stream header past the end of the stored chunk");
            };
            so += 4;
            let Some(end) = so.checked_add(cs).filter(|&e| e <= src.len()) else {
                return bad("stream past the end of the stored chunk");
            };
            let at = start + k * neblock;
            streams.push(Piece {
                src: so..end,
                dst: at..at + neblock,
                raw: cs == neblock,
            });
            so = end;
        }
        let post = if doshuffle {
            Unshuffle::Bytes { typesize: ts }
        } else if dobitshuffle && this >= ts && (this / ts) % 8 == 0 {
            Unshuffle::Bits {
                typesize: ts,
                elems: this / ts,
            }
        } else {
            Unshuffle::None
        };
        blocks.push((start..start + this, post));
    }
    Ok(Bloscd {
        streams,
        blocks,
        ..whole
    })
}

/// Adler-32 (RFC 1950) of `data`, to check a zlib stream's decoded bytes.
pub fn adler32(data: &[u8]) -> u32 {
    const M: u32 = 65_521;
    let (mut a, mut b) = (1u32, 0u32);
    // 5 552 bytes is the most that cannot overflow `b` before the reduction.
    for block in data.chunks(5552) {
        for &x in block {
            a += u32::from(x);
            b += a;
        }
        a %= M;
        b %= M;
    }
    b << 16 | a
}

#[cfg(test)]
mod tests {
    /// The Adler-32 as the GPU kernel (src/gpu/kernels/post.cu) computes it, from 256
    /// threads' strided sums: A = 1 + sum of bytes, B = len + sum of (len - i) * byte_i,
    /// both mod 65 521, equals the running definition.
    #[test]
    fn adler32_from_strided_weighted_sums() {
        for n in [0usize, 1, 255, 256, 5553, 1 << 20, (1 << 20) + 17] {
            let data: Vec<u8> = (0..n).map(|i| (i * 7919 % 251) as u8 ^ 0xa5).collect();
            let m = 65_521u64;
            let (mut s_all, mut w_all) = (0u64, 0u64);
            for t in 0..256 {
                let (mut s, mut w) = (0u64, 0u64);
                for i in (t..n).step_by(256) {
                    s += u64::from(data[i]);
                    w += (n - i) as u64 * u64::from(data[i]);
                }
                s_all = (s_all + s % m) % m;
                w_all = (w_all + w % m) % m;
            }
            let a = (1 + s_all) % m;
            let b = (n as u64 % m + w_all) % m;
            assert_eq!(((b << 16) | a) as u32, adler32(&data), "n = {n}");
        }
    }

    use super::*;
    use crate::codecs::encode::{compress, Codec};
    use std::io::Read;

    fn field(n: usize) -> Vec<u8> {
        (0..n / 4)
            .flat_map(|i| ((i as f32 * 0.01).sin() * 100.0).round().to_le_bytes())
            .collect()
    }

    /// HDF5's deflate chunks: the raw stream between header and trailer inflates (as a
    /// raw-deflate decoder such as nvCOMP's would) to the chunk's bytes, and the trailer
    /// is their Adler-32; damaged headers are refused.
    #[test]
    fn zlib_chunks_give_their_raw_stream_and_checksum() {
        for n in [0usize, 4, 1 << 16, 3 << 20] {
            let data = field(n);
            let chunk = compress(&Codec::Gzip(4), &data, 4).unwrap();
            let (raw, adler) = zlib(&chunk).unwrap();
            let mut out = Vec::new();
            flate2::read::DeflateDecoder::new(&chunk[raw])
                .read_to_end(&mut out)
                .unwrap();
            assert_eq!(out, data);
            assert_eq!(adler, adler32(&data));
            let mut bad = chunk.clone();
            bad[1] ^= 1;
            assert!(zlib(&bad).is_err());
        }
        assert!(zlib(&[0x78, 0x9c, 0, 0]).is_err());
        assert_eq!(adler32(b"Wikipedia"), 0x11e6_0398);
    }

    /// Bitshuffle + LZ4 and + Zstandard chunks (blocks of 1 024 elements, a short last
    /// block and a tail of 5 elements): each block decoded and bit-unshuffled, and the
    /// tail copied, give what the host decoder gives; damage is refused.
    #[test]
    fn bitshuffle_chunks_split_into_the_host_decoders_blocks() {
        let es = 4usize;
        let n = 3 * 1024 + 512 + 8 + 5;
        let data = field(n * es);
        let block = 1024usize;
        for codec in [2u32, 3] {
            let mut chunk = (data.len() as u64).to_be_bytes().to_vec();
            chunk.extend(((block * es) as u32).to_be_bytes());
            let whole = n - n % 8;
            let mut at = 0;
            while at < whole {
                let b = block.min(whole - at);
                let mut t = vec![0u8; b * es];
                crate::codecs::encode::bitshuffle_into(
                    &data[at * es..(at + b) * es],
                    b,
                    es,
                    &mut t,
                );
                let c = if codec == 2 {
                    lz4_flex::block::compress(&t)
                } else {
                    zstd::bulk::compress(&t, 3).unwrap()
                };
                chunk.extend((c.len() as u32).to_be_bytes());
                chunk.extend(c);
                at += b;
            }
            chunk.extend(&data[whole * es..]);
            let cd = [0, 0, es as u32, 0, codec];
            let host = crate::codecs::bitshuffle_filter(&chunk, &cd, es, 1 << 20).unwrap();
            assert_eq!(host, data);
            let b = bitshuffle(&chunk, &cd, es, 1 << 20).unwrap();
            assert_eq!(
                (b.total, b.es, b.codec, b.blocks.len()),
                (data.len(), es, codec, 4)
            );
            let mut out = vec![0u8; b.total];
            for (p, elems) in &b.blocks {
                let mut t = vec![0u8; p.dst.len()];
                if codec == 2 {
                    lz4_flex::block::decompress_into(&chunk[p.src.clone()], &mut t).unwrap();
                } else {
                    zstd::bulk::decompress_to_buffer(&chunk[p.src.clone()], &mut t).unwrap();
                }
                crate::codecs::bitunshuffle(&t, *elems, es, &mut out[p.dst.clone()]);
            }
            out[b.tail.dst.clone()].copy_from_slice(&chunk[b.tail.src.clone()]);
            assert_eq!(out, host);
            assert!(bitshuffle(&chunk[..chunk.len() - 1], &cd, es, 1 << 20).is_err());
            assert!(bitshuffle(&chunk, &cd, es, data.len() - 1).is_err());
            assert!(bitshuffle(&chunk, &[0, 0, es as u32, 0, 0], es, 1 << 20).is_err());
        }
    }

    /// Blosc chunks (LZ4 and Zstandard streams; no shuffle, byte and bit shuffle; level 0
    /// copied): the streams decoded into a staging image and each block unshuffled into
    /// the output give what the host decoder gives; BloscLZ streams are left to the host.
    #[test]
    fn blosc_chunks_split_into_the_host_decoders_streams() {
        use crate::codecs::encode::{Blosc, BloscName};
        let data = field(3 << 20);
        for (cname, clevel, shuffle) in [
            (BloscName::Lz4, 5, 0),
            (BloscName::Lz4, 5, 1),
            (BloscName::Zstd, 5, 2),
            (BloscName::Zstd, 3, 1),
            (BloscName::Lz4, 0, 1),
        ] {
            let b = Blosc {
                cname,
                clevel,
                shuffle,
            };
            let chunk = compress(&Codec::Blosc(b), &data, 4).unwrap();
            let host = crate::codecs::blosc(&chunk, 4 << 20).unwrap();
            assert_eq!(host, data);
            let d = blosc(&chunk, 4 << 20).unwrap();
            let mut staged = vec![0u8; d.total];
            for p in &d.streams {
                let t = &mut staged[p.dst.clone()];
                if p.raw {
                    t.copy_from_slice(&chunk[p.src.clone()]);
                } else if d.codec == 1 {
                    lz4_flex::block::decompress_into(&chunk[p.src.clone()], t).unwrap();
                } else {
                    zstd::bulk::decompress_to_buffer(&chunk[p.src.clone()], t).unwrap();
                }
            }
            let mut out = vec![0u8; d.total];
            for (r, post) in &d.blocks {
                let (src, dst) = (&staged[r.clone()], &mut out[r.clone()]);
                match *post {
                    Unshuffle::None => dst.copy_from_slice(src),
                    Unshuffle::Bytes { typesize } => {
                        crate::codecs::unshuffle_into(src, typesize, dst)
                    }
                    Unshuffle::Bits { typesize, elems } => {
                        crate::codecs::bitunshuffle(src, elems, typesize, dst);
                        dst[elems * typesize..].copy_from_slice(&src[elems * typesize..]);
                    }
                }
            }
            assert!(out == host, "{cname:?} {clevel} {shuffle}");
            assert!(blosc(&chunk, data.len() - 1).is_err());
        }
        let lz = Blosc {
            cname: BloscName::Blosclz,
            clevel: 5,
            shuffle: 1,
        };
        let chunk = compress(&Codec::Blosc(lz), &data, 4).unwrap();
        assert!(blosc(&chunk, 4 << 20).is_err(), "BloscLZ is the host's");
        assert!(blosc(&chunk[..15], 4 << 20).is_err());
    }

    /// HDF5 LZ4 chunks of one block (as hdf5plugin writes them) and of several, with a
    /// block stored raw: each piece decodes (or copies) to its part of the chunk, as the
    /// host decoder gives it; lies about sizes are refused.
    #[test]
    fn lz4_chunks_split_into_the_host_decoders_blocks() {
        let data = field(1 << 20);
        let one = compress(&Codec::Lz4, &data, 4).unwrap();
        // three blocks of 256 KiB and a short one, the second stored raw
        let bs = 256 << 10;
        let mut many = (data.len() as u64).to_be_bytes().to_vec();
        many.extend((bs as u32).to_be_bytes());
        for (k, b) in data.chunks(bs).enumerate() {
            let c = if k == 1 {
                b.to_vec()
            } else {
                lz4_flex::block::compress(b)
            };
            many.extend((c.len() as u32).to_be_bytes());
            many.extend(c);
        }
        for chunk in [&one, &many] {
            let host = crate::codecs::lz4_filter(chunk, 4 << 20).unwrap();
            let (total, pieces) = lz4(chunk, 4 << 20).unwrap();
            assert_eq!(total, host.len());
            let mut out = vec![0u8; total];
            for p in &pieces {
                if p.raw {
                    out[p.dst.clone()].copy_from_slice(&chunk[p.src.clone()]);
                } else {
                    let n = lz4_flex::block::decompress_into(
                        &chunk[p.src.clone()],
                        &mut out[p.dst.clone()],
                    )
                    .unwrap();
                    assert_eq!(n, p.dst.len());
                }
            }
            assert_eq!(out, host);
        }
        assert!(lz4(&many, 1 << 20).is_ok());
        assert!(lz4(&many, (1 << 20) - 1).is_err(), "over the bound");
        assert!(lz4(&many[..many.len() - 1], 4 << 20).is_err(), "cut short");
        let mut zero = many.clone();
        zero[8..12].copy_from_slice(&0u32.to_be_bytes());
        assert!(lz4(&zero, 4 << 20).is_err(), "block size 0");
        let mut lie = many.clone();
        lie[12..16].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(lz4(&lie, 4 << 20).is_err(), "block past the end");
    }
}
