//! Pure pieces of the write path: validating a pending dataset's meta.json, and the
//! sets of byte ranges written to each tile (kept in append-only logs on the backing
//! file system, so any daemon, or a restarted one, can tell what is complete).

use crate::error::{Error, Result};
use crate::geometry::TileGrid;
use serde_json::{json, Map, Value};

/// NumPy dtype strings a pending dataset may use, normalized to `dtype.str`.
pub fn normalize_dtype(s: &str) -> Option<String> {
    let named = match s {
        "bool" | "?" => Some("|b1"),
        "int8" | "i1" => Some("|i1"),
        "uint8" | "u1" => Some("|u1"),
        "int16" => Some("<i2"),
        "uint16" => Some("<u2"),
        "int32" => Some("<i4"),
        "uint32" => Some("<u4"),
        "int64" => Some("<i8"),
        "uint64" => Some("<u8"),
        "float16" => Some("<f2"),
        "float32" => Some("<f4"),
        "float64" => Some("<f8"),
        "complex64" => Some("<c8"),
        "complex128" => Some("<c16"),
        _ => None,
    };
    if let Some(n) = named {
        return Some(n.to_string());
    }
    let mut c = s.chars();
    let order = c.next()?;
    let kind = c.next()?;
    let size: u64 = c.as_str().parse().ok()?;
    let ok = match kind {
        'b' => size == 1,
        'i' | 'u' => [1, 2, 4, 8].contains(&size),
        'f' => [2, 4, 8].contains(&size),
        'c' => [8, 16].contains(&size),
        _ => false,
    };
    if !ok {
        return None;
    }
    let order = match (order, size) {
        (_, 1) => '|',
        ('<' | '=', _) => '<',
        ('>', _) => '>',
        ('|', _) => return None,
        _ => return None,
    };
    if !matches!(order, '<' | '>' | '|') {
        return None;
    }
    Some(format!("{order}{kind}{size}"))
}

/// The accepted description of a pending dataset.
#[derive(Clone, Debug, PartialEq)]
pub struct PendingMeta {
    pub shape: Vec<u64>,
    pub dtype: String,
    pub itemsize: u64,
    pub tile_shape: Vec<u64>,
    pub fill_value: Value,
    pub attrs: Map<String, Value>,
    /// `"unwritten_tiles": "fill"`: a tile no writer touched reads as the fill value
    /// after the commit (it gets no VDS mapping) instead of refusing the commit. Zarr
    /// declarations set it, since Zarr skips chunks equal to the fill value.
    pub fill_unwritten: bool,
    /// `"layout": "chunked"`: committed as one chunked dataset (chunk = tile) of the
    /// file itself, its tiles written in place; else a virtual dataset over one source
    /// file per tile.
    pub chunked: bool,
    /// `"compression"` (with `"compression_opts"`, `"shuffle"`): the chunked layout's
    /// chunks are stored through this filter pipeline.
    pub compression: Option<crate::codecs::encode::Compression>,
    /// `"dims"`: a name per dimension (or null), as xarray's `dimension_names`: the
    /// commit makes them netCDF-4 dimension scales (`writer::dims`).
    pub dims: Option<Vec<Option<String>>>,
}

/// A non-finite float as meta.json may give it ("nan", "inf", "-inf", or Zarr's
/// "NaN", "Infinity", "-Infinity").
pub fn non_finite(v: &Value) -> Option<f64> {
    match v.as_str()? {
        "nan" | "NaN" => Some(f64::NAN),
        "inf" | "Infinity" => Some(f64::INFINITY),
        "-inf" | "-Infinity" => Some(f64::NEG_INFINITY),
        _ => None,
    }
}

/// The keys a pending dataset's meta.json sets.
pub const SETTINGS: &[&str] = &[
    "shape",
    "dtype",
    "tile_shape",
    "fill_value",
    "unwritten_tiles",
    "attrs",
    "layout",
    "compression",
    "compression_opts",
    "shuffle",
    "dims",
];

/// Keys the daemon serves back in a pending dataset's meta.json and derives itself: a
/// meta.json read back and written again is taken (their values are ignored, except
/// `order`, which only "C" can be).
pub const DERIVED: &[&str] = &["itemsize", "state", "tile_grid", "nbytes", "order"];

/// Settings h5py has that the mount does not write, refused with their own reason
/// rather than as unknown, so the user knows why the setting is not taken.
const NOT_TAKEN: &[(&str, &str)] = &[
    (
        "fletcher32",
        "a Fletcher-32 checksum covers the whole stored chunk, which the compressed layout's slots cannot give it",
    ),
    ("scaleoffset", "the scale-offset filter is lossy and not written by the mount"),
    ("chunks", "the chunk shape is the tile shape: set \"tile_shape\""),
];

/// A misspelled or unsupported key would silently lose a setting (`tile_shap`, or
/// `compression` before it is supported): every key must be one we know.
fn check_keys(o: &Map<String, Value>) -> Result<()> {
    for k in o.keys() {
        if SETTINGS.contains(&k.as_str()) || DERIVED.contains(&k.as_str()) {
            continue;
        }
        if let Some((_, why)) = NOT_TAKEN.iter().find(|(n, _)| n == k) {
            return Err(Error::invalid(format!(
                "meta.json key {k:?} is not taken: {why}; remove it"
            )));
        }
        return Err(Error::invalid(format!(
            "meta.json has unknown key {k:?}: the keys are {}",
            SETTINGS.join(", ")
        )));
    }
    if let Some(order) = o.get("order") {
        if order.as_str() != Some("C") {
            return Err(Error::invalid(format!(
                "meta.json \"order\" {order} is not taken: tiles are C order (row-major); \
                 remove the key"
            )));
        }
    }
    Ok(())
}

fn u64_list(v: &Value, what: &str) -> Result<Vec<u64>> {
    v.as_array()
        .ok_or_else(|| Error::invalid(format!("{what} must be a list of integers")))?
        .iter()
        .map(|x| {
            x.as_u64()
                .ok_or_else(|| Error::invalid(format!("{what}: {x} is not a non-negative integer")))
        })
        .collect()
}

/// meta.json's `"dims"`: one entry per dimension, each a name (an HDF5 link name: not
/// empty, no `/`, not `.`) or null.
fn parse_dims(v: &Value, rank: usize) -> Result<Vec<Option<String>>> {
    const WHAT: &str = "meta.json \"dims\" must list a name (or null) per dimension";
    let a = v.as_array().ok_or_else(|| Error::invalid(WHAT))?;
    if a.len() != rank {
        return Err(Error::invalid(format!(
            "{WHAT}: {} names for rank {rank}",
            a.len()
        )));
    }
    a.iter()
        .map(|d| match d {
            Value::Null => Ok(None),
            Value::String(n) if !n.is_empty() && !n.contains('/') && n != "." && n != ".." => {
                Ok(Some(n.clone()))
            }
            other => Err(Error::invalid(format!(
                "{WHAT}: {other} is not a name (no \"/\", not empty)"
            ))),
        })
        .collect()
}

impl PendingMeta {
    /// Parses what a user wrote into a pending dataset's meta.json.
    pub fn parse(bytes: &[u8]) -> Result<PendingMeta> {
        let v: Value = serde_json::from_slice(bytes)
            .map_err(|e| Error::invalid(format!("meta.json is not valid JSON: {e}")))?;
        let o = v
            .as_object()
            .ok_or_else(|| Error::invalid("meta.json must be a JSON object"))?;
        check_keys(o)?;
        let shape = u64_list(
            o.get("shape")
                .ok_or_else(|| Error::invalid("meta.json needs \"shape\""))?,
            "shape",
        )?;
        if shape.len() > 32 {
            return Err(Error::invalid("rank above 32 is not supported by HDF5"));
        }
        let dstr = o
            .get("dtype")
            .and_then(Value::as_str)
            .ok_or_else(|| Error::invalid("meta.json needs \"dtype\" (a NumPy dtype string)"))?;
        let dtype = normalize_dtype(dstr)
            .ok_or_else(|| Error::invalid(format!("unknown or unsupported dtype {dstr:?}")))?;
        let itemsize: u64 = dtype[2..].parse().unwrap_or(0);
        let tile_shape = match o.get("tile_shape") {
            Some(t) => u64_list(t, "tile_shape")?,
            None => shape.iter().map(|&s| s.max(1)).collect(),
        };
        if tile_shape.len() != shape.len() {
            return Err(Error::invalid(format!(
                "tile_shape has rank {} but shape has rank {}",
                tile_shape.len(),
                shape.len()
            )));
        }
        if tile_shape.contains(&0) {
            return Err(Error::invalid("tile_shape entries must be > 0"));
        }
        let total = shape
            .iter()
            .try_fold(itemsize, |a, &d| a.checked_mul(d))
            .filter(|&b| b < (1u64 << 62))
            .ok_or_else(|| Error::invalid("dataset size overflows"))?;
        let _ = total;
        tile_shape
            .iter()
            .try_fold(itemsize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| Error::invalid("tile size overflows"))?;
        let fill_value = o.get("fill_value").cloned().unwrap_or(Value::Null);
        let kind = dtype.as_bytes()[1];
        let part = |v: &Value| {
            v.is_number()
                || (kind != b'i' && kind != b'u' && kind != b'b' && non_finite(v).is_some())
        };
        let complex_pair = kind == b'c'
            && fill_value
                .as_array()
                .is_some_and(|a| a.len() == 2 && a.iter().all(part));
        if !(fill_value.is_null() || part(&fill_value) || fill_value.is_boolean() || complex_pair) {
            return Err(Error::invalid(
                "fill_value must be a number, \"nan\", \"inf\", \"-inf\", a bool or [re, im]",
            ));
        }
        let fill_unwritten = match o.get("unwritten_tiles").map(|v| v.as_str()) {
            None | Some(Some("error")) => false,
            Some(Some("fill")) => true,
            Some(_) => {
                return Err(Error::invalid(
                    "unwritten_tiles must be \"error\" (a commit needs every tile) or \"fill\" (tiles nobody wrote read as the fill value)",
                ))
            }
        };
        let chunked = match o.get("layout").map(|v| v.as_str()) {
            None | Some(Some("virtual")) => false,
            Some(Some("chunked")) => true,
            Some(_) => {
                return Err(Error::invalid(
                    "meta.json \"layout\" must be \"virtual\" (the default: one source file per tile) or \"chunked\" (one self-contained file, chunk = tile)",
                ))
            }
        };
        if chunked && shape.is_empty() {
            return Err(Error::invalid(
                "a scalar (shape []) cannot be chunked: use the virtual layout",
            ));
        }
        if chunked && shape.contains(&0) {
            return Err(Error::invalid(
                "a dataset with a dimension of length 0 cannot be chunked (HDF5 needs chunks no longer than fixed dimensions): use the virtual layout",
            ));
        }
        let compression = crate::codecs::encode::Compression::parse(
            o.get("compression"),
            o.get("compression_opts"),
            o.get("shuffle"),
        )
        .map_err(|e| Error::invalid(format!("meta.json: {e}")))?;
        if compression.is_some() && !chunked {
            return Err(Error::invalid(
                "meta.json \"compression\" needs \"layout\": \"chunked\" (the virtual layout's tile sources are stored uncompressed)",
            ));
        }
        let attrs = match o.get("attrs") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(m)) => m.clone(),
            Some(_) => return Err(Error::invalid("attrs must be a JSON object")),
        };
        let dims = match o.get("dims") {
            None | Some(Value::Null) => None,
            Some(v) => Some(parse_dims(v, shape.len())?),
        };
        Ok(PendingMeta {
            shape,
            dtype,
            itemsize,
            tile_shape,
            fill_value,
            attrs,
            fill_unwritten,
            chunked,
            compression,
            dims,
        })
    }

    /// The chunk shape of the chunked layout: the tile shape, clipped to the shape
    /// (HDF5 refuses chunks longer than a fixed dimension; the tile grid is the same).
    pub fn chunk_shape(&self) -> Vec<u64> {
        self.tile_shape
            .iter()
            .zip(&self.shape)
            .map(|(&t, &s)| t.min(s).max(1))
            .collect()
    }

    pub fn grid(&self) -> TileGrid {
        TileGrid::new(self.shape.clone(), self.tile_shape.clone())
    }

    pub fn nbytes(&self) -> u64 {
        self.shape.iter().product::<u64>() * self.itemsize
    }

    /// Bytes of tile `idx` (edge tiles clipped).
    pub fn tile_bytes(&self, idx: &[u64]) -> Option<u64> {
        Some(self.grid().tile_slab(idx)?.num_elements() * self.itemsize)
    }

    /// The JSON we store and serve back.
    pub fn to_json(&self) -> Value {
        let g = self.grid();
        let mut v = json!({
            "shape": self.shape,
            "dtype": self.dtype,
            "itemsize": self.itemsize,
            "layout": if self.chunked { "chunked" } else { "virtual" },
            "state": "pending",
            "tile_shape": self.tile_shape,
            "tile_grid": g.grid(),
            "nbytes": self.nbytes(),
            "fill_value": self.fill_value,
            "attrs": self.attrs,
            "order": "C",
            "unwritten_tiles": if self.fill_unwritten { "fill" } else { "error" },
        });
        if let (Some(d), Some(o)) = (&self.dims, v.as_object_mut()) {
            o.insert("dims".into(), json!(d));
        }
        if let (Some(c), Some(o)) = (&self.compression, v.as_object_mut()) {
            let (name, opts) = c.to_json();
            o.insert("compression".into(), name);
            if !opts.is_null() {
                o.insert("compression_opts".into(), opts);
            }
            o.insert("shuffle".into(), json!(c.shuffle));
        }
        v
    }
}

/// Disjoint, sorted half-open byte ranges.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RangeSet {
    ranges: Vec<(u64, u64)>,
}

impl RangeSet {
    pub fn insert(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let (mut s, mut e) = (start, end);
        let mut out = Vec::with_capacity(self.ranges.len() + 1);
        let mut placed = false;
        for &(a, b) in &self.ranges {
            if b < s {
                out.push((a, b));
            } else if a > e {
                if !placed {
                    out.push((s, e));
                    placed = true;
                }
                out.push((a, b));
            } else {
                s = s.min(a);
                e = e.max(b);
            }
        }
        if !placed {
            out.push((s, e));
        }
        self.ranges = out;
    }

    /// The ranges of `[0, total)` not covered.
    pub fn missing(&self, total: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut at = 0;
        for &(a, b) in &self.ranges {
            if a >= total {
                break;
            }
            if a > at {
                out.push((at, a));
            }
            at = at.max(b);
        }
        if at < total {
            out.push((at, total));
        }
        out
    }

    pub fn ranges(&self) -> &[(u64, u64)] {
        &self.ranges
    }

    pub fn covered(&self) -> u64 {
        self.ranges.iter().map(|(a, b)| b - a).sum()
    }

    /// Decodes an append-only log of 16-byte records (start, len as little-endian u64).
    /// A torn last record (a crash mid-append) is ignored: its write was never
    /// acknowledged.
    pub fn from_log(bytes: &[u8]) -> RangeSet {
        let mut rs = RangeSet::default();
        for rec in bytes.chunks_exact(16) {
            let mut a = [0u8; 8];
            let mut b = [0u8; 8];
            a.copy_from_slice(&rec[..8]);
            b.copy_from_slice(&rec[8..]);
            let s = u64::from_le_bytes(a);
            let l = u64::from_le_bytes(b);
            rs.insert(s, s.saturating_add(l));
        }
        rs
    }

    pub fn log_record(start: u64, len: u64) -> [u8; 16] {
        let mut r = [0u8; 16];
        r[..8].copy_from_slice(&start.to_le_bytes());
        r[8..].copy_from_slice(&len.to_le_bytes());
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn meta_accepts_and_rejects() {
        let m =
            PendingMeta::parse(br#"{"shape":[10,7],"dtype":"<f4","tile_shape":[4,4]}"#).unwrap();
        assert_eq!(m.grid().grid(), vec![3, 2]);
        assert_eq!(m.tile_bytes(&[2, 1]), Some(2 * 3 * 4));
        assert_eq!(
            PendingMeta::parse(br#"{"shape":[4],"dtype":"float64"}"#)
                .unwrap()
                .dtype,
            "<f8"
        );
        for bad in [
            &br#"{"shape":[4],"dtype":"<f4""#[..],
            br#"[1]"#,
            br#"{"shape":[4],"dtype":"S5"}"#,
            br#"{"shape":[4],"dtype":"<f4","tile_shape":[2,2]}"#,
            br#"{"shape":[4],"dtype":"<f4","tile_shape":[0]}"#,
            br#"{"shape":[4294967296,4294967296,16],"dtype":"<f8"}"#,
            br#"{"shape":[-1],"dtype":"<f4"}"#,
            br#"{"dtype":"<f4"}"#,
            br#"{"shape":[4],"dtype":"<f4","tile_shap":[2]}"#,
            br#"{"shape":[4],"dtype":"<f4","compression":"gzip"}"#,
            br#"{"shape":[4],"dtype":"<f4","layout":"chunked","compression":"blosc2"}"#,
            br#"{"shape":[4],"dtype":"<f4","layout":"chunked","fletcher32":true}"#,
            br#"{"shape":[4],"dtype":"<f4","layout":"contiguous"}"#,
            br#"{"shape":[],"dtype":"<f4","layout":"chunked"}"#,
            br#"{"shape":[4],"dtype":"<f4","order":"F"}"#,
        ] {
            let e = PendingMeta::parse(bad).unwrap_err();
            assert_eq!(e.errno, libc::EINVAL, "{}", String::from_utf8_lossy(bad));
        }
    }

    /// Every key of a misspelled or unsupported setting is named in the refusal; what
    /// the daemon serves back is taken again.
    #[test]
    fn meta_refuses_unknown_keys_by_name() {
        let e = PendingMeta::parse(br#"{"shape":[4],"dtype":"<f4","tile_shap":[2]}"#).unwrap_err();
        assert!(e.message.contains("\"tile_shap\""), "{}", e.message);
        let e =
            PendingMeta::parse(br#"{"shape":[4],"dtype":"<f4","compression":"gzip"}"#).unwrap_err();
        assert!(e.message.contains("\"compression\""), "{}", e.message);
        for ok in [
            &br#"{"shape":[10,7],"dtype":"<f4","tile_shape":[4,4],"layout":"virtual"}"#[..],
            br#"{"shape":[10,7],"dtype":"<f4","tile_shape":[4,4],"layout":"chunked","compression":"gzip","compression_opts":6,"shuffle":true}"#,
            br#"{"shape":[10,7],"dtype":"<i2","tile_shape":[4,4],"layout":"chunked","compression":"lz4"}"#,
        ] {
            let m = PendingMeta::parse(ok).unwrap();
            let served = serde_json::to_vec(&m.to_json()).unwrap();
            assert_eq!(PendingMeta::parse(&served).unwrap(), m);
        }
    }

    #[test]
    fn ranges_merge_and_report_missing() {
        let mut r = RangeSet::default();
        r.insert(10, 20);
        r.insert(30, 40);
        r.insert(20, 30);
        assert_eq!(r.missing(50), vec![(0, 10), (40, 50)]);
        r.insert(0, 10);
        r.insert(40, 50);
        assert!(r.missing(50).is_empty());
        let mut log = Vec::new();
        log.extend(RangeSet::log_record(0, 5));
        log.extend(RangeSet::log_record(5, 5));
        log.extend([1, 2, 3]); // torn record
        assert_eq!(RangeSet::from_log(&log).missing(10), vec![]);
    }

    proptest! {
        #[test]
        fn ranges_match_bitmap(ops in proptest::collection::vec((0u64..64, 0u64..16), 0..20)) {
            let mut r = RangeSet::default();
            let mut bits = [false; 80];
            for (s, l) in ops {
                r.insert(s, s + l);
                for b in &mut bits[s as usize..(s + l) as usize] { *b = true; }
            }
            let missing = r.missing(80);
            let mut m2 = [false; 80];
            for (a, b) in missing { for x in &mut m2[a as usize..b as usize] { *x = true; } }
            for i in 0..80 { prop_assert_eq!(bits[i], !m2[i]); }
        }
    }
}
