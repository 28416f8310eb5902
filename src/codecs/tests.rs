//! The codecs' tests: round trips against reference encoders, bounds, and crafted
//! input.

use super::blocks::*;
use super::filters::*;
use super::lz77::*;
use super::shuffle::*;
use super::*;

/// Bitshuffle's transpose, written out bit by bit (the definition, not the trick).
fn bitshuffle_ref(data: &[u8], n: usize, es: usize) -> Vec<u8> {
    let nrow = n / 8;
    let mut out = vec![0u8; n * es];
    for i in 0..n {
        for j in 0..es {
            for k in 0..8 {
                let bit = (data[i * es + j] >> k) & 1;
                let row = j * 8 + k;
                out[row * nrow + i / 8] |= bit << (i % 8);
            }
        }
    }
    out
}

#[test]
fn bitunshuffle_inverts_the_definition() {
    // Sizes below, at and around the 128-element SIMD block, and a large one.
    for es in [1usize, 2, 3, 4, 5, 8, 12, 16] {
        for n in [0usize, 8, 64, 120, 128, 136, 256, 264, 1024, 4096 + 72] {
            let data: Vec<u8> = (0..n * es).map(|i| (i * 37 + 11 + i / 7) as u8).collect();
            let sh = bitshuffle_ref(&data, n, es);
            let mut back = vec![0u8; n * es];
            assert!(crate::ckernels::bitunshuffle_simd(&sh, n, es, &mut back));
            assert_eq!(back, data, "es {es} n {n}");
            bitunshuffle(&sh, n, es, &mut back);
            assert_eq!(back, data, "es {es} n {n}");
            let mut rust = vec![0u8; n * es];
            bitunshuffle_rust(&sh, n, es, &mut rust);
            assert_eq!(rust, data, "rust es {es} n {n}");
            let mut scalar = vec![0u8; n * es];
            bitunshuffle_scalar(&sh, n, es, &mut scalar);
            assert_eq!(scalar, data, "scalar es {es} n {n}");
        }
    }
}

/// Throughput of the bit unshuffle, SIMD against the scalar reference (not a test
/// of speed: run with --ignored --nocapture to see the numbers).
#[test]
#[ignore]
fn bitunshuffle_throughput() {
    let (n, es) = (1usize << 18, 4usize); // 1 MiB
    let data: Vec<u8> = (0..n * es)
        .map(|i| ((i * 2654435761usize) >> 7) as u8)
        .collect();
    let sh = bitshuffle_ref(&data, n, es);
    let mut out = vec![0u8; n * es];
    for (name, f) in [
        (
            "c-blosc2",
            bitunshuffle as fn(&[u8], usize, usize, &mut [u8]),
        ),
        ("rust sse2", bitunshuffle_rust),
        ("scalar", bitunshuffle_scalar),
    ] {
        let t = std::time::Instant::now();
        for _ in 0..200 {
            f(&sh, n, es, &mut out);
        }
        let gbs = 200.0 * (n * es) as f64 / t.elapsed().as_secs_f64() / 1e9;
        println!("bitunshuffle {name}: {gbs:.2} GB/s");
        assert_eq!(out, data);
    }
}

/// (element size, source bytes) for the byte shuffle tests: element sizes with and
/// without SIMD kernels, lengths below and around the vector widths and with trailing
/// bytes that make no whole element.
fn byte_shuffle_cases() -> impl Iterator<Item = (usize, Vec<u8>)> {
    (1usize..=17).chain([255, 256, 300]).flat_map(|es| {
        [
            0usize,
            1,
            15,
            16,
            31,
            32,
            33,
            64 * es + 3,
            256 * es,
            4096 + 5,
        ]
        .into_iter()
        .map(move |len| (es, (0..len).map(|i| (i * 131 + i / 3) as u8).collect()))
    })
}

#[test]
fn byte_unshuffle_matches_the_rust_reference() {
    for (es, src) in byte_shuffle_cases() {
        let len = src.len();
        let mut c = vec![0xAAu8; len];
        let mut r = vec![0x55u8; len];
        // The C kernel itself, not a fallback, for the sizes it takes.
        let ran = crate::ckernels::unshuffle_simd(&src, es, &mut c);
        assert_eq!(ran, (2..=255).contains(&es), "es {es} len {len}");
        if !ran {
            unshuffle_into(&src, es, &mut c);
        }
        unshuffle_rust(&src, es, &mut r);
        assert_eq!(c, r, "es {es} len {len}");
    }
}

/// An element size near 2^27 (an HDF5 shuffle filter's, read from a crafted file)
/// made c-blosc2's SIMD unshuffle compute `typesize * 32` = 0 in `int32_t` and die
/// with SIGFPE (2^27 + 1 wraps to 32 and writes gigabytes past the buffer): such
/// sizes take the Rust path, which treats one element as a copy.
#[test]
fn byte_unshuffle_of_huge_elements_stays_in_bounds() {
    for es in [1usize << 27, crate::ckernels::MAX_SIMD_ELEMENT + 1] {
        let src: Vec<u8> = (0..es).map(|i| (i % 251) as u8).collect();
        let mut dst = vec![0u8; es];
        assert!(!crate::ckernels::unshuffle_simd(&src, es, &mut dst));
        unshuffle_into(&src, es, &mut dst);
        assert!(dst == src, "es {es}");
    }
}

#[test]
fn lz4_blocks_that_lie_are_refused() {
    let data: Vec<u8> = (0..10_000u32).map(|i| (i % 97) as u8).collect();
    let c = lz4_flex::block::compress(&data);
    let mut out = vec![0u8; data.len()];
    lz4_block(&c, &mut out).unwrap();
    assert_eq!(out, data);
    // Too small or too large a destination, a truncated block, a block of garbage:
    // each is an error.
    let mut small = vec![0u8; data.len() - 1];
    assert!(lz4_block(&c, &mut small).is_err());
    let mut big = vec![0u8; data.len() + 1];
    assert!(lz4_block(&c, &mut big).is_err());
    assert!(lz4_block(&c[..c.len() / 2], &mut out).is_err());
    let junk: Vec<u8> = (0..300u32).map(|i| (i * 7919 % 251) as u8).collect();
    assert!(lz4_block(&junk, &mut out).is_err());
}

/// Zstandard chunks from H5TILEFS_ZSTD_CHUNKS (u32 LE length + frame, repeated):
/// decoded into one reused buffer, and into a fresh buffer per chunk as the cell
/// cache does (not a test of speed: run with --ignored --nocapture).
#[test]
#[ignore]
fn zstd_fresh_vs_reused_buffers() {
    let Ok(path) = std::env::var("H5TILEFS_ZSTD_CHUNKS") else {
        return;
    };
    let raw = std::fs::read(path).unwrap();
    let mut frames = Vec::new();
    let mut at = 0;
    while at + 4 <= raw.len() {
        let n = u32::from_le_bytes(raw[at..at + 4].try_into().unwrap()) as usize;
        frames.push(&raw[at + 4..at + 4 + n]);
        at += 4 + n;
    }
    let size = zstd::zstd_safe::get_frame_content_size(frames[0])
        .unwrap()
        .unwrap() as usize;
    let total = (frames.len() * size) as f64;
    for round in 0..3 {
        let mut reused = vec![0u8; size];
        let t = std::time::Instant::now();
        for f in &frames {
            zstd_into(f, &mut reused).unwrap();
        }
        let a = t.elapsed().as_secs_f64();
        let t = std::time::Instant::now();
        let mut keep = Vec::new();
        for f in &frames {
            keep.push(zstd_filter(f, size).unwrap());
        }
        let b = t.elapsed().as_secs_f64();
        drop(keep);
        println!(
            "round {round}: reused buffer {:.0} MB/s, fresh buffers {:.0} MB/s",
            total / a / 1e6,
            total / b / 1e6
        );
    }
}

/// Throughput of the LZ4 block decoder on a smooth float32 field (not a test of
/// speed: run with --ignored --nocapture to see the number).
#[test]
#[ignore]
fn lz4_throughput() {
    let mut v = 0i32;
    let data: Vec<u8> = (0..1usize << 18)
        .flat_map(|i| {
            v += ((i * 2654435761usize) >> 13) as i32 % 17 - 8;
            (v as f32).to_le_bytes()
        })
        .collect();
    let mut sh = vec![0u8; data.len()];
    unshuffle_into(&data, 4, &mut sh); // any byte permutation compresses alike
    let c = lz4_flex::block::compress(&sh);
    let mut out = vec![0u8; data.len()];
    let t = std::time::Instant::now();
    for _ in 0..200 {
        lz4_block(&c, &mut out).unwrap();
    }
    let gbs = 200.0 * data.len() as f64 / t.elapsed().as_secs_f64() / 1e9;
    println!(
        "lz4 decode: {gbs:.2} GB/s (ratio {:.2})",
        data.len() as f64 / c.len() as f64
    );
    assert_eq!(out, sh);
}

#[test]
fn lzf_literals_and_matches() {
    // "abcabcabcabc": literal "abc", then a 9-byte match at distance 3.
    let s = [2u8, b'a', b'b', b'c', (7 << 5), 9 - 2 - 7, 2];
    assert_eq!(lzf(&s, 100).unwrap(), b"abcabcabcabc");
    // Bounded: the same stream with a cap of 8 is refused, not truncated.
    assert!(matches!(lzf(&s, 8), Err(Failure::Refused(_))));
    // A match reaching before the start, and truncated streams, are corrupt.
    assert!(matches!(lzf(&[0x20, 5], 100), Err(Failure::Corrupt(_))));
    assert!(matches!(lzf(&[5, b'a'], 100), Err(Failure::Corrupt(_))));
    assert!(matches!(lzf(&[0xe0], 100), Err(Failure::Corrupt(_))));
}

fn lz4_chunk(data: &[u8], bs: usize) -> Vec<u8> {
    let mut v = (data.len() as u64).to_be_bytes().to_vec();
    v.extend_from_slice(&(bs as u32).to_be_bytes());
    for b in data.chunks(bs) {
        let c = lz4_flex::block::compress(b);
        if c.len() >= b.len() {
            v.extend_from_slice(&(b.len() as u32).to_be_bytes());
            v.extend_from_slice(b);
        } else {
            v.extend_from_slice(&(c.len() as u32).to_be_bytes());
            v.extend_from_slice(&c);
        }
    }
    v
}

#[test]
fn lz4_framing_and_bounds() {
    let data: Vec<u8> = (0..10_000u32).flat_map(|v| (v / 7).to_le_bytes()).collect();
    let mut noisy = data.clone();
    noisy.extend((0..3000u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8));
    for d in [&data, &noisy] {
        let c = lz4_chunk(d, 4096);
        assert_eq!(lz4_filter(&c, d.len()).unwrap(), *d);
        // Declared size above the chunk: refused before allocating.
        assert!(matches!(
            lz4_filter(&c, d.len() - 1),
            Err(Failure::Refused(_))
        ));
        // Every truncation is an error, never a panic.
        for cut in [0, 5, 12, 15, c.len() / 2, c.len() - 1] {
            assert!(lz4_filter(&c[..cut], d.len()).is_err(), "cut {cut}");
        }
    }
    // A huge declared size with a tiny cap.
    let mut c = lz4_chunk(&data, 4096);
    c[..8].copy_from_slice(&u64::MAX.to_be_bytes());
    assert!(matches!(lz4_filter(&c, 1 << 20), Err(Failure::Refused(_))));
    // Block size 0 with data.
    let mut c = lz4_chunk(&data, 4096);
    c[8..12].copy_from_slice(&0u32.to_be_bytes());
    assert!(lz4_filter(&c, data.len()).is_err());
}

fn bshuf_chunk(data: &[u8], es: usize, block: usize, zstd: bool) -> Vec<u8> {
    let n = data.len() / es;
    let mut v = (data.len() as u64).to_be_bytes().to_vec();
    v.extend_from_slice(&((block * es) as u32).to_be_bytes());
    let last = n % block - n % block % 8;
    let mut at = 0;
    for b in std::iter::repeat_n(block, n / block).chain((last > 0).then_some(last)) {
        let sh = bitshuffle_ref(&data[at * es..(at + b) * es], b, es);
        let c = if zstd {
            zstd::bulk::compress(&sh, 3).unwrap()
        } else {
            lz4_flex::block::compress(&sh)
        };
        v.extend_from_slice(&(c.len() as u32).to_be_bytes());
        v.extend_from_slice(&c);
        at += b;
    }
    v.extend_from_slice(&data[at * es..]);
    v
}

#[test]
fn bitshuffle_framing_and_bounds() {
    for es in [1usize, 2, 4, 8] {
        // 1003 elements: 3 full blocks of 256, a last block of 232, 3 trailing.
        let data: Vec<u8> = (0..1003 * es).map(|i| ((i * i) >> 3) as u8).collect();
        for zstd in [false, true] {
            let cd = [0, 0, es as u32, 256, if zstd { 3 } else { 2 }];
            let c = bshuf_chunk(&data, es, 256, zstd);
            assert_eq!(bitshuffle_filter(&c, &cd, es, data.len()).unwrap(), data);
            assert!(matches!(
                bitshuffle_filter(&c, &cd, es, data.len() - 1),
                Err(Failure::Refused(_))
            ));
            for cut in [0, 11, 12, 20, c.len() / 2, c.len() - 1] {
                assert!(bitshuffle_filter(&c[..cut], &cd, es, data.len()).is_err());
            }
        }
        // Uncompressed: blocks of the default size, no header.
        let n = data.len() / es;
        let block = bshuf_default_block(es);
        let mut raw = Vec::new();
        let mut at = 0;
        let last = n % block - n % block % 8;
        for b in std::iter::repeat_n(block, n / block).chain((last > 0).then_some(last)) {
            raw.extend(bitshuffle_ref(&data[at * es..(at + b) * es], b, es));
            at += b;
        }
        raw.extend_from_slice(&data[at * es..]);
        let cd = [0, 0, es as u32, 0, 0];
        assert_eq!(bitshuffle_filter(&raw, &cd, es, data.len()).unwrap(), data);
    }
    // A block size that is not a multiple of 8 is rejected, not looped on.
    let mut c = bshuf_chunk(&[0u8; 64], 1, 16, false);
    c[8..12].copy_from_slice(&3u32.to_be_bytes());
    assert!(bitshuffle_filter(&c, &[0, 0, 1, 0, 2], 1, 64).is_err());
}

#[test]
fn zstd_and_bzip2_bounds() {
    let data = vec![5u8; 100_000];
    let z = zstd::bulk::compress(&data, 3).unwrap();
    assert_eq!(zstd_filter(&z, data.len()).unwrap(), data);
    assert!(matches!(zstd_filter(&z, 4096), Err(Failure::Refused(_))));
    assert!(zstd_filter(&z[..z.len() / 2], data.len()).is_err());
    // A frame without its size (streamed) is bounded while decoding.
    let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
    std::io::Write::write_all(&mut enc, &data).unwrap();
    let s = enc.finish().unwrap();
    assert_eq!(zstd_filter(&s, data.len()).unwrap(), data);
    assert!(matches!(zstd_filter(&s, 4096), Err(Failure::Refused(_))));

    let mut enc = bzip2::write::BzEncoder::new(Vec::new(), bzip2::Compression::new(9));
    std::io::Write::write_all(&mut enc, &data).unwrap();
    let b = enc.finish().unwrap();
    assert_eq!(bzip2_filter(&b, data.len()).unwrap(), data);
    assert!(matches!(bzip2_filter(&b, 4096), Err(Failure::Refused(_))));
    assert!(bzip2_filter(&b[..b.len() / 2], data.len()).is_err());
}

#[test]
fn blosc_header_checks() {
    assert!(blosc(&[2, 1, 0, 4], 100).is_err());
    // Declared size above the chunk: refused.
    let mut h = vec![2u8, 1, 0x01, 4];
    h.extend_from_slice(&(1u32 << 30).to_le_bytes());
    h.extend_from_slice(&4096u32.to_le_bytes());
    h.extend_from_slice(&16u32.to_le_bytes());
    assert!(matches!(blosc(&h, 1 << 20), Err(Failure::Refused(_))));
    // A memcpyed chunk.
    let mut m = vec![2u8, 1, 0x02, 1];
    m.extend_from_slice(&8u32.to_le_bytes());
    m.extend_from_slice(&8u32.to_le_bytes());
    m.extend_from_slice(&24u32.to_le_bytes());
    m.extend_from_slice(b"12345678");
    assert_eq!(blosc(&m, 8).unwrap(), b"12345678");
    // Its stored size says more than there is.
    m[12] = 40;
    assert!(blosc(&m, 8).is_err());
    // A block table past the end.
    let mut t = vec![2u8, 1, 0x00, 1];
    t.extend_from_slice(&4096u32.to_le_bytes());
    t.extend_from_slice(&16u32.to_le_bytes());
    t.extend_from_slice(&20u32.to_le_bytes());
    t.extend_from_slice(&[0; 4]);
    assert!(blosc(&t, 4096).is_err());
}

#[test]
fn blosclz_runs_and_bad_refs() {
    // Literal "ab" (first ctrl & 31 = 1), then a match len 3+... at distance 2.
    // ctrl = (len_code << 5) | ofs_hi with len_code-1+3 = 5 -> len_code 3; code = 1
    // (distance = code + 1 = 2).
    let s = [1u8, b'a', b'b', (3 << 5), 1, 0, b'z'];
    let mut out = Vec::new();
    blosclz(&s, 8, &mut out).unwrap();
    assert_eq!(out, b"abababaz");
    // A reference before the start is corrupt.
    let s = [1u8, b'a', b'b', (3 << 5), 9, 0, b'z'];
    assert!(blosclz(&s, 8, &mut Vec::new()).is_err());
    // Wrong declared size.
    assert!(blosclz(&[1u8, b'a', b'b'], 8, &mut Vec::new()).is_err());
}

/// A Blosc 1 chunk as c-blosc writes it: byte shuffle, LZ4, split streams for full
/// blocks, a leftover block in one stream; incompressible streams stored raw.
fn blosc_chunk(data: &[u8], ts: usize, bsize: usize) -> Vec<u8> {
    let nblocks = data.len().div_ceil(bsize);
    let mut v = vec![2u8, 1, 0x01 | (1 << 5), ts as u8];
    v.extend_from_slice(&(data.len() as u32).to_le_bytes());
    v.extend_from_slice(&(bsize as u32).to_le_bytes());
    v.extend_from_slice(&[0; 4]);
    let table = v.len();
    v.resize(table + 4 * nblocks, 0);
    for (j, block) in data.chunks(bsize).enumerate() {
        let at = v.len() as u32;
        v[table + 4 * j..table + 4 * j + 4].copy_from_slice(&at.to_le_bytes());
        let n = block.len() / ts;
        let mut sh = vec![0u8; block.len()];
        for i in 0..n {
            for b in 0..ts {
                sh[b * n + i] = block[i * ts + b];
            }
        }
        sh[n * ts..].copy_from_slice(&block[n * ts..]);
        let splits = if block.len() == bsize && block.len() / ts >= 128 {
            ts
        } else {
            1
        };
        for s in sh.chunks(block.len() / splits) {
            let c = lz4_flex::block::compress(s);
            let c = if c.len() >= s.len() { s.to_vec() } else { c };
            v.extend_from_slice(&(c.len() as u32).to_le_bytes());
            v.extend_from_slice(&c);
        }
    }
    let n = v.len() as u32;
    v[12..16].copy_from_slice(&n.to_le_bytes());
    v
}

#[test]
fn blosc_blocks_splits_and_truncation() {
    let data: Vec<u8> = (0..5000u32)
        .flat_map(|i| ((i / 3) as f32).to_le_bytes())
        .chain((0..37u8).map(|i| i.wrapping_mul(77)))
        .collect();
    let c = blosc_chunk(&data, 4, 4096);
    assert_eq!(blosc(&c, data.len()).unwrap(), data);
    assert!(matches!(
        blosc(&c, data.len() - 1),
        Err(Failure::Refused(_))
    ));
    for cut in (0..c.len()).step_by(7) {
        assert!(blosc(&c[..cut], data.len()).is_err(), "cut {cut}");
    }
}

/// Crafted input: every decoder, fed mutated valid chunks and random bytes, returns
/// an error or at most `cap` bytes, and never panics.
#[test]
fn mutated_inputs_are_bounded() {
    let data: Vec<u8> = (0..4096u32).flat_map(|i| (i / 5).to_le_bytes()).collect();
    let cap = data.len();
    let lzf_of = |d: &[u8]| {
        // Literal runs only: a valid LZF stream of `d`.
        let mut v = Vec::new();
        for c in d.chunks(32) {
            v.push((c.len() - 1) as u8);
            v.extend_from_slice(c);
        }
        v
    };
    let cases: Vec<(i32, Vec<u32>, Vec<u8>)> = vec![
        (LZF, vec![], lzf_of(&data)),
        (BLOSC, vec![], blosc_chunk(&data, 4, 2048)),
        (LZ4, vec![], lz4_chunk(&data, 1000)),
        (
            BITSHUFFLE,
            vec![0, 0, 4, 0, 2],
            bshuf_chunk(&data, 4, 128, false),
        ),
        (
            BITSHUFFLE,
            vec![0, 0, 4, 0, 3],
            bshuf_chunk(&data, 4, 128, true),
        ),
        (ZSTD, vec![], zstd::bulk::compress(&data, 3).unwrap()),
    ];
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for (id, cd, good) in &cases {
        assert_eq!(decode(*id, cd, 4, good, cap).unwrap(), data, "filter {id}");
        for _ in 0..300 {
            let mut m = good.clone();
            for _ in 0..1 + rnd() % 4 {
                let at = (rnd() as usize) % m.len();
                m[at] = rnd() as u8;
            }
            if let Ok(out) = decode(*id, cd, 4, &m, cap) {
                assert!(out.len() <= cap);
            }
        }
        for len in [0usize, 1, 7, 16, 100, 5000] {
            let junk: Vec<u8> = (0..len).map(|_| rnd() as u8).collect();
            let mut out = Vec::new();
            if blosclz(&junk, 4096, &mut out).is_ok() {
                assert_eq!(out.len(), 4096);
            }
            let junk: Vec<u8> = (0..len).map(|_| rnd() as u8).collect();
            if let Ok(out) = decode(*id, cd, 4, &junk, cap) {
                assert!(out.len() <= cap);
            }
        }
    }
}

#[test]
fn lzo_reason_names_a_fix_that_exists() {
    // hdf5plugin has no LZO filter: its advice would not help.
    let name = super::registered_name(super::LZO).unwrap();
    let r = super::no_decoder_reason(super::LZO, name);
    assert!(r.starts_with("filter 305 (lzo) has no decoder"), "{r}");
    assert!(r.contains("ptrepack --complib"), "{r}");
    assert!(!r.contains("HDF5_PLUGIN_PATH"), "{r}");
    let z = super::no_decoder_reason(32013, "zfp");
    assert!(
        z.contains("HDF5_PLUGIN_PATH") && z.contains("hdf5plugin"),
        "{z}"
    );
}

/// c-blosc2's byte shuffle, used by the commit's encoders, writes what the Rust
/// reference writes (trailing bytes included), and unshuffles back to the input.
#[test]
fn byte_shuffle_matches_the_rust_reference() {
    for (es, src) in byte_shuffle_cases() {
        let len = src.len();
        let mut c = vec![0xAAu8; len];
        let mut r = vec![0x55u8; len];
        let ran = crate::ckernels::shuffle_simd(&src, es, &mut c);
        assert_eq!(ran, (2..=255).contains(&es), "es {es} len {len}");
        if !ran {
            super::encode::shuffle_rust(&src, es, &mut c);
        }
        super::encode::shuffle_rust(&src, es, &mut r);
        assert_eq!(c, r, "es {es} len {len}");
        let mut back = vec![0u8; len];
        unshuffle_into(&c, es, &mut back);
        assert_eq!(back, src, "es {es} len {len}");
    }
}
