//! What a stored chunk's filter pipeline becomes on the GPU: nvCOMP's codec, the
//! kernels after it, and a Fletcher-32 checksum checked on the host. A pipeline this
//! maps to nothing stays on the host decoders.

use super::nvcomp::Codec;

/// How a chunk's pipeline maps onto a batch: what runs after nvCOMP's codec.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    /// Nothing: the codec's output is the chunk.
    Plain,
    /// HDF5's shuffle filter ran before deflate: undone by a kernel.
    Shuffled,
    /// A Blosc chunk: its LZ4 or Zstd streams decode into staging, then each block is
    /// unshuffled (or copied) by a kernel.
    Blosc,
    /// A Bitshuffle chunk with LZ4 or Zstd blocks: each decodes into staging and is
    /// bit-unshuffled by a kernel; the trailing elements are copied.
    Bitshuffle,
}

/// The element size the shuffle filter of `s` works in (its parameter, else the
/// dataset's element size, as the host decoder takes it).
pub(super) fn shuffle_es(s: &crate::extent::Stored) -> u64 {
    s.filters
        .iter()
        .position(|&f| f == crate::codecs::SHUFFLE)
        .and_then(|i| s.cd.get(i)?.first())
        .map_or(s.elem, |&v| u64::from(v))
        // (0 or 1: no shuffle, as the host decoder takes it; 1 is a copy in the kernel,
        // so the slot is always written)
        .max(1)
}

/// How a stored chunk's pipeline runs on the GPU: nvCOMP's codec, what runs after
/// it, and whether a Fletcher-32 checksum ends the stored bytes (checked on the host
/// as the image is read, before anything decodes; HDF5 writers put it last).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Pipeline {
    pub codec: Codec,
    pub kind: Kind,
    pub fletcher: bool,
}

/// The pipeline of a chunk stored through `s.filters`, if nvCOMP decodes it. Blosc's
/// inner codec is its seventh parameter (1 and 2 LZ4, 5 Zstd; without one, BloscLZ, as
/// hdf5-blosc takes it: the host's), Bitshuffle's its fifth (2 LZ4, 3 Zstd); each
/// chunk's header is checked against it when the chunk is taken apart.
pub(super) fn codec_of(s: &crate::extent::Stored) -> Option<Pipeline> {
    use crate::codecs::{BITSHUFFLE, BLOSC, DEFLATE, FLETCHER32, LZ4, SHUFFLE, ZSTD};
    let (filters, fletcher) = match s.filters.as_slice() {
        [rest @ .., FLETCHER32] => (rest, true),
        all => (all, false),
    };
    let param = |i: usize, k: usize| s.cd.get(i).and_then(|cd| cd.get(k)).copied();
    let (codec, kind) = match filters {
        [LZ4] => (Codec::Lz4, Kind::Plain),
        [ZSTD] => (Codec::Zstd, Kind::Plain),
        [DEFLATE] => (Codec::Deflate, Kind::Plain),
        [SHUFFLE, DEFLATE] => (Codec::Deflate, Kind::Shuffled),
        [BLOSC] => match param(filters.len() - 1, 6) {
            Some(1 | 2) => (Codec::Lz4, Kind::Blosc),
            Some(5) => (Codec::Zstd, Kind::Blosc),
            _ => return None,
        },
        [BITSHUFFLE] => match param(filters.len() - 1, 4) {
            Some(2) => (Codec::Lz4, Kind::Bitshuffle),
            Some(3) => (Codec::Zstd, Kind::Bitshuffle),
            _ => return None,
        },
        _ => return None,
    };
    Some(Pipeline {
        codec,
        kind,
        fletcher,
    })
}

/// Whether the Fletcher-32 checksum that ends `stored` matches the bytes before it.
pub(super) fn fletcher_ok(stored: &[u8]) -> bool {
    let Some(n) = stored.len().checked_sub(4) else {
        return false;
    };
    let want = u32::from_le_bytes([stored[n], stored[n + 1], stored[n + 2], stored[n + 3]]);
    let sum = crate::codecs::fletcher32(&stored[..n]);
    want == sum || want == sum.swap_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codecs::{BITSHUFFLE, BLOSC, DEFLATE, FLETCHER32, LZ4, SHUFFLE, ZSTD};
    use crate::extent::{BackingFile, CellSource, Stored};
    use crate::gpu::nvcomp::Codec;
    use std::sync::Arc;

    fn stored(filters: &[i32], cd: &[&[u32]]) -> Stored {
        Stored {
            file: Arc::new(BackingFile {
                path: "/dev/null".into(),
                file: std::fs::File::open("/dev/null").unwrap(),
            }),
            addr: 0,
            size: 0,
            filters: filters.to_vec(),
            cd: cd.iter().map(|c| c.to_vec()).collect(),
            elem: 4,
        }
    }

    fn pipe(codec: Codec, kind: Kind, fletcher: bool) -> Option<Pipeline> {
        Some(Pipeline {
            codec,
            kind,
            fletcher,
        })
    }

    /// Blosc's and Bitshuffle's inner codec comes from their parameters, a trailing
    /// Fletcher-32 is checked on the host, and pipelines the GPU has no route for
    /// (a checksum before the codec, BloscLZ, Bitshuffle without compression) are left
    /// to the host.
    #[test]
    fn pipelines_map_to_codecs_by_their_parameters() {
        let blosc = |c: u32| stored(&[BLOSC], &[&[2, 2, 4, 4096, 5, 1, c]]);
        assert_eq!(codec_of(&blosc(1)), pipe(Codec::Lz4, Kind::Blosc, false));
        assert_eq!(codec_of(&blosc(2)), pipe(Codec::Lz4, Kind::Blosc, false));
        assert_eq!(codec_of(&blosc(5)), pipe(Codec::Zstd, Kind::Blosc, false));
        assert_eq!(codec_of(&blosc(0)), None);
        assert_eq!(codec_of(&blosc(4)), None);
        // (no compressor parameter: BloscLZ, as hdf5-blosc takes it)
        assert_eq!(codec_of(&stored(&[BLOSC], &[&[2, 2, 4]])), None);
        let bshuf = |c: u32| stored(&[BITSHUFFLE], &[&[0, 4, 4, 0, c]]);
        assert_eq!(
            codec_of(&bshuf(2)),
            pipe(Codec::Lz4, Kind::Bitshuffle, false)
        );
        assert_eq!(
            codec_of(&bshuf(3)),
            pipe(Codec::Zstd, Kind::Bitshuffle, false)
        );
        assert_eq!(codec_of(&bshuf(0)), None);
        assert_eq!(
            codec_of(&stored(&[SHUFFLE, DEFLATE, FLETCHER32], &[&[], &[1], &[]])),
            pipe(Codec::Deflate, Kind::Shuffled, true)
        );
        assert_eq!(
            codec_of(&stored(&[ZSTD, FLETCHER32], &[&[], &[]])),
            pipe(Codec::Zstd, Kind::Plain, true)
        );
        assert_eq!(
            codec_of(&stored(&[LZ4], &[&[]])),
            pipe(Codec::Lz4, Kind::Plain, false)
        );
        assert_eq!(codec_of(&stored(&[FLETCHER32, DEFLATE], &[&[], &[]])), None);
        assert_eq!(codec_of(&stored(&[FLETCHER32], &[&[]])), None);
    }

    /// A shuffle parameter of 0 is taken as no shuffle (a copy), never as an element
    /// size of 0 that would leave the chunk's slot unwritten.
    #[test]
    fn shuffle_parameter_zero_is_a_copy() {
        assert_eq!(shuffle_es(&stored(&[SHUFFLE, DEFLATE], &[&[0], &[1]])), 1);
        assert_eq!(shuffle_es(&stored(&[SHUFFLE, DEFLATE], &[&[8], &[1]])), 8);
        // (no parameter: the dataset's element size)
        assert_eq!(shuffle_es(&stored(&[SHUFFLE, DEFLATE], &[&[], &[1]])), 4);
    }

    /// A chunk libhdf5 wrote through shuffle, deflate and Fletcher-32: its pipeline is
    /// found, its checksum holds as stored and fails for a flipped byte, and once it is
    /// stripped the zlib framing gives the stream whose Adler-32 the host's inflate
    /// confirms.
    #[test]
    fn fletcher_checked_on_a_chunk_libhdf5_wrote() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.h5");
        let data: Vec<f32> = (0..4096).map(|i| (i as f32 * 0.01).sin()).collect();
        {
            let f = hdf5::File::create(&path).unwrap();
            f.new_dataset::<f32>()
                .shape([4096])
                .chunk([1024])
                .shuffle()
                .deflate(1)
                .fletcher32()
                .create("x")
                .unwrap()
                .write(&data)
                .unwrap();
        }
        let f = hdf5::File::open(&path).unwrap();
        let ds = f.dataset("x").unwrap();
        let filters = crate::h5::filters(&crate::h5::dcpl(ds.id()).unwrap()).unwrap();
        let backing = Arc::new(BackingFile {
            path: path.clone(),
            file: std::fs::File::open(&path).unwrap(),
        });
        let store =
            crate::decode::ChunkStore::new("/x", backing, ds, vec![4096], vec![1024], 4, filters)
                .unwrap();
        let s = store.stored(1).unwrap();
        assert_eq!(codec_of(&s), pipe(Codec::Deflate, Kind::Shuffled, true));
        let mut bytes = vec![0u8; s.size as usize];
        std::os::unix::fs::FileExt::read_exact_at(&s.file.file, &mut bytes, s.addr).unwrap();
        assert!(fletcher_ok(&bytes));
        let mut bad = bytes.clone();
        bad[7] ^= 1;
        assert!(!fletcher_ok(&bad));
        assert!(!fletcher_ok(&bytes[..3]));
        let body = &bytes[..bytes.len() - 4];
        let (raw, adler) = crate::gpu::framing::zlib(body).unwrap();
        let inflated = crate::codecs::filter(DEFLATE)
            .unwrap()
            .decode(
                body.to_vec(),
                &crate::codecs::Params { cd: &[1], elem: 4 },
                4096,
            )
            .unwrap();
        assert_eq!(inflated.len(), 4096);
        assert_eq!(crate::gpu::framing::adler32(&inflated), adler);
        assert!(raw.start == 2 && raw.end == body.len() - 4);
    }
}
