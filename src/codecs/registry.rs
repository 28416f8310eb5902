//! The one list of the filters this build decodes ([`filter`]), each a [`Filter`]:
//! the pipeline (decode::decode_chunk), whether a dataset is decodable in Rust
//! ([`builtin`]) and the names of meta.json all read it.

use super::{c, filters, hdf5, lz77, Failure, Out};
use super::{BITSHUFFLE, BLOSC, BLOSC2, BZIP2, DEFLATE, FLETCHER32, LZ4, LZF, SHUFFLE, ZSTD};

/// What a filter's decoder is told besides its input: the filter's parameters as the
/// file stores them (cd_values) and the dataset's element size.
pub struct Params<'a> {
    pub cd: &'a [u32],
    pub elem: usize,
}

/// One filter of an HDF5 pipeline that this build decodes.
pub trait Filter: Sync {
    /// Its id in The HDF Group's filter registry.
    fn id(&self) -> i32;
    /// Its registered name, for messages and meta.json.
    fn name(&self) -> &'static str;
    /// Runs the filter backwards over `input`, producing at most `cap` bytes (the
    /// chunk's decoded size plus the checksums of earlier filters): sizes read from the
    /// stream are checked against `cap` before anything is allocated.
    /// `Failure::Refused`: the stream would produce more; `Failure::Corrupt`: it is
    /// corrupt, truncated or an unsupported variant.
    fn decode(&self, input: Vec<u8>, p: &Params<'_>, cap: usize) -> Out;
    /// Whether libhdf5, when it has the filter too, may decode a chunk this decoder
    /// found corrupt (its error, or its result, is then the reference). A refusal is
    /// never handed on.
    fn hdf5_may_retry(&self) -> bool {
        true
    }
}

/// Every filter this build decodes.
static FILTERS: &[&dyn Filter] = &[
    &Deflate,
    &Shuffle,
    &Fletcher32,
    // SZIP needs libaec, linked when the build found it (build.rs)
    #[cfg(h5tilefs_szip)]
    &Szip,
    &Lzf,
    &Blosc,
    &Lz4,
    &Bitshuffle,
    &Zstd,
    &Bzip2,
    &Blosc2,
];

/// Every filter this build decodes (also registered with libhdf5: h5::zfilters).
pub fn decoders() -> &'static [&'static dyn Filter] {
    FILTERS
}

/// The decoder of filter `id`, if this build has one.
pub fn filter(id: i32) -> Option<&'static dyn Filter> {
    FILTERS.iter().copied().find(|f| f.id() == id)
}

/// Whether filter `id` is decoded in Rust (or by a C library linked in).
pub fn builtin(id: i32) -> bool {
    filter(id).is_some()
}

/// A decoder's failure prefixed with its filter's name ("lz4 filter: ..."); HDF5's
/// own filters name themselves in their messages.
fn named(name: &str, r: Out) -> Out {
    r.map_err(|e| match e {
        Failure::Corrupt(m) => Failure::Corrupt(format!("{name} filter: {m}")),
        Failure::Refused(m) => Failure::Refused(format!("{name} filter: {m}")),
    })
}

/// A unit type implementing [`Filter`] with `id`, `name` and the decode body.
macro_rules! filter {
    ($ty:ident, $id:expr, $name:literal, |$input:ident, $p:ident, $cap:ident| $body:expr) => {
        struct $ty;
        impl Filter for $ty {
            fn id(&self) -> i32 {
                $id
            }
            fn name(&self) -> &'static str {
                $name
            }
            fn decode(&self, $input: Vec<u8>, $p: &Params<'_>, $cap: usize) -> Out {
                $body
            }
        }
    };
}

filter!(Deflate, DEFLATE, "gzip", |input, _p, cap| {
    hdf5::inflate_bounded(&input, cap)
});
filter!(Shuffle, SHUFFLE, "shuffle", |input, p, _cap| {
    let es = p.cd.first().map(|&v| v as usize).unwrap_or(p.elem);
    Ok(hdf5::unshuffle(&input, es))
});
filter!(Fletcher32, FLETCHER32, "fletcher32", |input, _p, _cap| {
    hdf5::fletcher32_strip(input)
});
#[cfg(h5tilefs_szip)]
filter!(Szip, super::SZIP, "szip", |input, p, cap| {
    named("szip", c::szip_filter(&input, p.cd, cap))
});
filter!(Lzf, LZF, "lzf", |input, _p, cap| {
    named("lzf", lz77::lzf(&input, cap))
});
filter!(Blosc, BLOSC, "blosc", |input, _p, cap| {
    named("blosc", filters::blosc(&input, cap))
});
filter!(Lz4, LZ4, "lz4", |input, _p, cap| {
    named("lz4", filters::lz4_filter(&input, cap))
});
filter!(Bitshuffle, BITSHUFFLE, "bitshuffle", |input, p, cap| {
    named(
        "bitshuffle",
        filters::bitshuffle_filter(&input, p.cd, p.elem, cap),
    )
});
filter!(Zstd, ZSTD, "zstd", |input, _p, cap| {
    named("zstd", filters::zstd_filter(&input, cap))
});
filter!(Bzip2, BZIP2, "bzip2", |input, _p, cap| {
    named("bzip2", filters::bzip2_filter(&input, cap))
});
filter!(Blosc2, BLOSC2, "blosc2", |input, _p, cap| {
    named("blosc2", c::blosc2_filter(&input, cap))
});
