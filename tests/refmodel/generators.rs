//! The programs the reference model runs: what an operation is (`Op`), the datasets it
//! declares (`Spec`), and proptest strategies that generate random sequences of them.
//! Nothing here knows how a program runs or what it should answer.

use proptest::prelude::*;

pub(crate) const CORES: usize = 3;
pub(crate) const FILES: [&str; 2] = ["f0.h5", "f1.h5"];
/// Dataset names; `g/..` ones live in group `g` (made by `mkdir` on the way, as
/// `mkdir -p` does). Replaced files hold the flat ones only.
pub(crate) const DSETS: [&str; 5] = ["d0", "d1", "d2", "g/d0", "g/d1"];
pub(crate) const FLAT: u8 = 3;
/// Old handles kept open at once by a sequence.
pub(crate) const MAX_HANDLES: usize = 4;
/// Each core keeps the dentries a kernel would (see [`Core`]); `Op::Expire` drops them.
pub(crate) const DENTRIES: bool = true;

// ---------------------------------------------------------------------------------
// Dataset descriptions
// ---------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dt {
    U8,
    I32,
    F64,
}

impl Dt {
    pub(crate) fn descr(self) -> &'static str {
        match self {
            Dt::U8 => "|u1",
            Dt::I32 => "<i4",
            Dt::F64 => "<f8",
        }
    }
    pub(crate) fn size(self) -> usize {
        match self {
            Dt::U8 => 1,
            Dt::I32 => 4,
            Dt::F64 => 8,
        }
    }
    /// Bytes of one element holding `v`, as the dataset stores it (little endian).
    pub(crate) fn elem(self, v: i64) -> Vec<u8> {
        match self {
            Dt::U8 => vec![v as u8],
            Dt::I32 => (v as i32).to_le_bytes().to_vec(),
            Dt::F64 => (v as f64).to_le_bytes().to_vec(),
        }
    }
}

/// What a `meta.json` write declares (and what a replaced file holds).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Spec {
    pub(crate) dt: Dt,
    pub(crate) shape: Vec<u64>,
    pub(crate) tile: Vec<u64>,
    pub(crate) fill: i64,
    /// `"layout": "chunked"` (docs/namespace.md, "The chunked layout"): committed the
    /// same bytes as the virtual layout, through another path.
    pub(crate) chunked: bool,
}

impl Spec {
    pub(crate) fn nelem(&self) -> usize {
        self.shape.iter().product::<u64>() as usize
    }
    pub(crate) fn nbytes(&self) -> usize {
        self.nelem() * self.dt.size()
    }
    pub(crate) fn grid(&self) -> Vec<u64> {
        self.shape
            .iter()
            .zip(&self.tile)
            .map(|(s, t)| s.div_ceil(*t))
            .collect()
    }
    pub(crate) fn ntiles(&self) -> usize {
        self.grid().iter().product::<u64>() as usize
    }
    /// Tile number `t` (C order over the grid) as its index.
    pub(crate) fn tile_idx(&self, mut t: usize) -> Vec<u64> {
        let g = self.grid();
        let mut idx = vec![0; g.len()];
        for d in (0..g.len()).rev() {
            idx[d] = (t as u64) % g[d];
            t /= g[d] as usize;
        }
        idx
    }
    pub(crate) fn tile_name(&self, t: usize) -> String {
        self.tile_idx(t)
            .iter()
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(".")
    }
    /// Global element numbers of tile `t`, in the tile's C order (edge tiles clipped).
    pub(crate) fn tile_elems(&self, t: usize) -> Vec<usize> {
        let idx = self.tile_idx(t);
        let start: Vec<u64> = idx.iter().zip(&self.tile).map(|(i, s)| i * s).collect();
        let count: Vec<u64> = (0..idx.len())
            .map(|d| self.tile[d].min(self.shape[d] - start[d]))
            .collect();
        let n: u64 = count.iter().product();
        let mut out = Vec::with_capacity(n as usize);
        for k in 0..n {
            let mut rem = k;
            let mut lin = 0u64;
            let mut local = vec![0u64; count.len()];
            for d in (0..count.len()).rev() {
                local[d] = rem % count[d];
                rem /= count[d];
            }
            for d in 0..count.len() {
                lin = lin * self.shape[d] + start[d] + local[d];
            }
            out.push(lin as usize);
        }
        out
    }
    /// Tile `t`'s bytes, cut out of the full C-order array `full`.
    pub(crate) fn tile_bytes(&self, full: &[u8], t: usize) -> Vec<u8> {
        let is = self.dt.size();
        let mut out = Vec::new();
        for e in self.tile_elems(t) {
            out.extend_from_slice(&full[e * is..(e + 1) * is]);
        }
        out
    }
    /// Bytes of a Zarr chunk: the whole tile shape, edge chunks padded.
    pub(crate) fn chunk_bytes(&self) -> usize {
        self.tile.iter().product::<u64>() as usize * self.dt.size()
    }
    /// Where element `k` of tile `t` (in the order of [`Spec::tile_elems`]) stands in
    /// its padded Zarr chunk, as an element number.
    pub(crate) fn chunk_pos(&self, t: usize, k: usize) -> usize {
        let idx = self.tile_idx(t);
        let count: Vec<u64> = (0..idx.len())
            .map(|d| self.tile[d].min(self.shape[d] - idx[d] * self.tile[d]))
            .collect();
        let mut rem = k as u64;
        let mut local = vec![0u64; count.len()];
        for d in (0..count.len()).rev() {
            local[d] = rem % count[d];
            rem /= count[d];
        }
        local
            .iter()
            .zip(&self.tile)
            .fold(0u64, |acc, (l, t)| acc * t + l) as usize
    }
    pub(crate) fn meta_json(&self) -> Vec<u8> {
        let mut m = serde_json::json!({
            "shape": self.shape,
            "dtype": self.dt.descr(),
            "tile_shape": self.tile,
            "fill_value": self.fill,
        });
        if self.chunked {
            m["layout"] = "chunked".into();
            // an odd fill value: declared compressed too (the data is the same to the
            // model; the commit's encoding, and its writers', are what is exercised)
            // (gzip, or Blosc with its bit shuffle; both after HDF5's shuffle, so the
            // Zarr view keeps serving and taking raw chunks, as the model writes them)
            if self.fill.rem_euclid(4) == 1 {
                m["compression"] = "gzip".into();
                m["shuffle"] = true.into();
            } else if self.fill.rem_euclid(4) == 3 {
                m["compression"] = "blosc".into();
                m["compression_opts"] =
                    serde_json::json!({"cname": "zstd", "clevel": 3, "shuffle": 2});
                m["shuffle"] = true.into();
            }
        }
        serde_json::to_vec(&m).expect("json")
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) enum Target {
    Data,
    /// Tile number modulo the tile count.
    Tile(u16),
    Meta,
    /// `slice/SEL` of a committed dataset: up to three items (more than the rank is an
    /// error), each `(kind, a, b, c)`: kind 0 the index `a`, else `a:b:c` with the parts
    /// present by the bits of `kind - 1` (1 start, 2 stop, 4 step).
    Slice([(u8, i8, i8, i8); 3], u8),
}

/// Which dataset an operation names, resolved against the model when it runs (so
/// that shrinking keeps sequences meaningful): the n-th pending dataset, the n-th
/// existing one (either list empty: the first name), or a fixed file and name.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Pick {
    Pending(u8),
    Any(u8),
    Raw(u8, u8),
}

#[derive(Clone, Debug)]
pub(crate) enum Op {
    /// mkdir of a new pending file.
    CreateFile {
        core: u8,
        file: u8,
    },
    /// mkdir of a dataset node in a (pending or committed) file, then its meta.json.
    Declare {
        core: u8,
        file: u8,
        ds: u8,
        spec: Spec,
    },
    /// meta.json of an existing pending dataset written again (same or other meta).
    Redeclare {
        core: u8,
        at: Pick,
        spec: Spec,
    },
    /// A tile write: whole tile, or the piece `[a % size, ...)` of `1 + b % rest` bytes.
    WriteTile {
        core: u8,
        at: Pick,
        tile: u16,
        piece: Option<(u16, u16)>,
        seed: u8,
    },
    /// A Zarr client's chunk (docs/namespace.md "Zarr writes"): the whole chunk
    /// `c/I/J` of tile `tile`, padded to the tile shape as Zarr writes edge chunks. `how`
    /// modulo 3: 0 writes the chunk's own name, 1 a temporary `<chunk>.<n>.partial`
    /// renamed onto it (zarr-python's LocalStore), 2 deletes the chunk (Zarr does so for
    /// a chunk equal to the fill value).
    WriteZarr {
        core: u8,
        at: Pick,
        tile: u16,
        how: u8,
        seed: u8,
    },
    /// A write to `data`: all of it, or a byte range.
    WriteData {
        core: u8,
        at: Pick,
        piece: Option<(u16, u16)>,
        seed: u8,
    },
    Rmdir {
        core: u8,
        at: Pick,
    },
    RmFile {
        core: u8,
        file: u8,
    },
    Commit {
        core: u8,
        file: u8,
    },
    /// A new HDF5 file written outside h5tilefs and renamed over the backing file.
    Replace {
        file: u8,
        dsets: Vec<(u8, Spec, bool, u8)>,
    },
    Read {
        core: u8,
        at: Pick,
        target: Target,
        window: (u16, u16),
    },
    List {
        core: u8,
        file: u8,
    },
    /// `.status` of a file: pending datasets, their tile counts and incomplete tiles
    /// (the union of every core's range logs).
    Status {
        core: u8,
        file: u8,
    },
    /// truncate(2) of `data` or a tile: to 0, to its size, or to another size.
    Truncate {
        core: u8,
        at: Pick,
        target: Target,
        size: u8,
    },
    Open {
        core: u8,
        at: Pick,
        target: Target,
    },
    ReadOld {
        k: u8,
    },
    Close {
        k: u8,
    },
    /// The entry TTL passes on one core: its cached dentries go.
    Expire {
        core: u8,
    },
}

pub(crate) fn spec_strategy() -> impl Strategy<Value = Spec> {
    let dt = prop_oneof![Just(Dt::U8), Just(Dt::I32), Just(Dt::F64)];
    (dt, 1usize..=2)
        .prop_flat_map(|(dt, rank)| {
            (
                Just(dt),
                prop::collection::vec(1u64..=8, rank),
                prop::collection::vec(2u64..=4, rank),
                prop_oneof![Just(0i64), 1i64..=9],
                prop::bool::weighted(0.4),
            )
        })
        .prop_map(|(dt, shape, tile, fill, chunked)| Spec {
            dt,
            shape,
            tile,
            fill,
            chunked,
        })
}

pub(crate) fn target_strategy() -> impl Strategy<Value = Target> {
    let item = (
        0u8..=8,
        -9i8..=9,
        -9i8..=9,
        prop_oneof![1 => -1i8..=0, 6 => 1i8..=4],
    );
    prop_oneof![
        2 => Just(Target::Data),
        2 => any::<u16>().prop_map(Target::Tile),
        1 => Just(Target::Meta),
        2 => (prop::array::uniform3(item), prop_oneof![6 => 1u8..=2, 1 => Just(3u8)])
            .prop_map(|(items, n)| Target::Slice(items, n)),
    ]
}

pub(crate) fn wpick_t() -> impl Strategy<Value = Pick> {
    prop_oneof![
        4 => any::<u8>().prop_map(Pick::Pending),
        1 => any::<u8>().prop_map(Pick::Any),
    ]
}

pub(crate) fn op_strategy() -> impl Strategy<Value = Op> {
    let core = 0u8..CORES as u8;
    let file = 0u8..FILES.len() as u8;
    let ds = 0u8..DSETS.len() as u8;
    let piece = prop::option::weighted(0.4, (any::<u16>(), any::<u16>()));
    let raw = (file.clone(), ds.clone()).prop_map(|(f, d)| Pick::Raw(f, d));
    // Writes mostly go to pending datasets, reads to any existing one; a few name
    // datasets that may not exist (ENOENT, EROFS paths).
    let wpick = prop_oneof![
        8 => any::<u8>().prop_map(Pick::Pending),
        1 => any::<u8>().prop_map(Pick::Any),
        1 => raw.clone(),
    ];
    let rpick = prop_oneof![
        8 => any::<u8>().prop_map(Pick::Any),
        1 => raw.clone(),
    ];
    prop_oneof![
        2 => (core.clone(), file.clone()).prop_map(|(core, file)| Op::CreateFile { core, file }),
        5 => (core.clone(), file.clone(), ds.clone(), spec_strategy())
            .prop_map(|(core, file, ds, spec)| Op::Declare { core, file, ds, spec }),
        1 => (core.clone(), wpick.clone(), spec_strategy())
            .prop_map(|(core, at, spec)| Op::Redeclare { core, at, spec }),
        10 => (core.clone(), wpick.clone(), any::<u16>(), piece.clone(), any::<u8>())
            .prop_map(|(core, at, tile, piece, seed)| Op::WriteTile { core, at, tile, piece, seed }),
        4 => (core.clone(), wpick.clone(), any::<u16>(), any::<u8>(), any::<u8>())
            .prop_map(|(core, at, tile, how, seed)| Op::WriteZarr { core, at, tile, how, seed }),
        4 => (core.clone(), wpick, piece, any::<u8>())
            .prop_map(|(core, at, piece, seed)| Op::WriteData { core, at, piece, seed }),
        2 => (core.clone(), rpick.clone()).prop_map(|(core, at)| Op::Rmdir { core, at }),
        1 => (core.clone(), file.clone()).prop_map(|(core, file)| Op::RmFile { core, file }),
        4 => (core.clone(), file.clone()).prop_map(|(core, file)| Op::Commit { core, file }),
        1 => (file.clone(), prop::collection::vec((ds.clone(), spec_strategy(), any::<bool>(), any::<u8>()), 0..3))
            .prop_map(|(file, dsets)| Op::Replace { file, dsets }),
        6 => (core.clone(), rpick.clone(), target_strategy(), (any::<u16>(), any::<u16>()))
            .prop_map(|(core, at, target, window)| Op::Read { core, at, target, window }),
        1 => (core.clone(), file.clone()).prop_map(|(core, file)| Op::List { core, file }),
        2 => (core.clone(), file.clone()).prop_map(|(core, file)| Op::Status { core, file }),
        1 => (core.clone(), wpick_t(), target_strategy(), any::<u8>())
            .prop_map(|(core, at, target, size)| Op::Truncate { core, at, target, size }),
        2 => (core.clone(), rpick, target_strategy())
            .prop_map(|(core, at, target)| Op::Open { core, at, target }),
        2 => any::<u8>().prop_map(|k| Op::ReadOld { k }),
        1 => any::<u8>().prop_map(|k| Op::Close { k }),
        1 => core.prop_map(|core| Op::Expire { core }),
    ]
}

/// Deterministic "random" bytes for a write.
pub(crate) fn bytes(seed: u8, salt: usize, n: usize) -> Vec<u8> {
    let mut x = (seed as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (salt as u64 + 1);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}
