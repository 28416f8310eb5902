//! The Zarr v3 view of the namespace (docs/namespace.md "Zarr"): a `zarr.json` in every
//! group and dataset directory and, in a dataset's, chunk files under `c/` in Zarr's
//! default chunk key encoding, so zarr-python, tensorstore and xarray read an HDF5
//! file with no HDF5 library. The chunk grid is the dataset's tile grid; a chunk's
//! bytes are its tile's, in the stored byte order (the `bytes` codec says which), and
//! an edge chunk is padded to the full chunk shape with the fill value as Zarr requires.
//! Only v3 metadata is served (see the docs for why not v2).

use serde_json::{json, Map, Value};

/// What the view needs to know of a dataset (model.rs builds it; this module knows no
/// model, so the layers stay acyclic).
pub struct ArrayInfo<'a> {
    /// The dataset's HDF5 path.
    pub name: &'a str,
    /// The shape shown: the dataset's, or along a netCDF-4 unlimited dimension the
    /// dimension's length (chunks past the dataset's end read as the fill value).
    pub shape: &'a [u64],
    pub tile_shape: &'a [u64],
    pub itemsize: u64,
    /// The NumPy dtype string, or why the dataset cannot be served at all.
    pub dtype: std::result::Result<String, String>,
    pub attrs: &'a Map<String, Value>,
    /// The fill value as meta.json gives it (null when the dataset defines none).
    pub fill: Value,
    /// The fill value's bytes (a string's fill is given as them).
    pub fill_bytes: &'a [u8],
    /// A variable-length string (served fixed width): decoded as text, not bytes.
    pub vlen_str: bool,
    /// A variable-length string's longest in characters, when all are valid UTF-8.
    pub text_chars: Option<u64>,
}

/// The largest chunk the view transcodes to UTF-32: a variable-length string dataset
/// whose chunks would be larger keeps the bytes form (made whole per chunk on open).
pub const MAX_TEXT_CHUNK: u64 = 256 << 20;

impl ArrayInfo<'_> {
    /// Characters per element when the dataset is shown as NumPy unicode (`<U{n}`,
    /// zarr-python's `fixed_length_utf32`), which is what netCDF readers give for
    /// variable-length strings: all valid UTF-8 and chunks within [`MAX_TEXT_CHUNK`].
    pub fn text_chars(&self) -> Option<u64> {
        let c = self.text_chars.filter(|_| self.vlen_str)?;
        (chunk_bytes(self.tile_shape, c.checked_mul(4)?) <= MAX_TEXT_CHUNK).then_some(c)
    }

    /// The size of one element in the chunk files.
    pub fn zarr_itemsize(&self) -> u64 {
        self.text_chars().map_or(self.itemsize, |c| c * 4)
    }
}

/// NUL-padded UTF-8 elements of `width` bytes as UTF-32LE elements of `chars`
/// characters (NumPy's `<U{chars}`), NUL padded. Text that is not UTF-8 (the file
/// changed since it was measured) is replaced, never read past its element.
pub fn utf32(src: &[u8], width: usize, chars: usize) -> Vec<u8> {
    let n = src.len().checked_div(width).unwrap_or(0);
    let mut out = vec![0u8; n.saturating_mul(chars).saturating_mul(4)];
    for (e, dst) in src
        .chunks_exact(width.max(1))
        .zip(out.chunks_exact_mut((chars * 4).max(1)))
    {
        let end = e.iter().position(|&b| b == 0).unwrap_or(e.len());
        let text = String::from_utf8_lossy(&e[..end]);
        for (c, d) in text.chars().zip(dst.chunks_exact_mut(4)) {
            d.copy_from_slice(&u32::from(c).to_le_bytes());
        }
    }
    out
}

/// Attributes HDF5 and netCDF-4 keep for themselves (dimension scales, netCDF's own
/// bookkeeping): dimension scales become `dimension_names`; the rest is left out, as
/// netCDF4-python and xarray leave them out.
const INTERNAL_ATTRS: [&str; 8] = [
    "CLASS",
    "NAME",
    "DIMENSION_LIST",
    "REFERENCE_LIST",
    "_Netcdf4Dimid",
    "_Netcdf4Coordinates",
    "_NCProperties",
    "_nc3_strict",
];

/// netCDF-4 marks a dimension without a coordinate variable with a dataset whose NAME
/// starts with this; netCDF readers do not show it as a variable, nor does the view.
pub const NC_DIM_ONLY: &str = "This is a netCDF dimension but not a netCDF variable";

/// The attributes Zarr shows: a one-element array as its element, as netCDF4-python
/// and h5py give it (netCDF stores every numeric attribute as an array), so xarray
/// reads `scale_factor` as a number and not as a list.
fn user_attrs(attrs: &Map<String, Value>) -> Map<String, Value> {
    attrs
        .iter()
        .filter(|(k, _)| !INTERNAL_ATTRS.contains(&k.as_str()))
        .map(|(k, v)| {
            let v = match v {
                Value::Array(a) if a.len() == 1 => a[0].clone(),
                _ => v.clone(),
            };
            (k.clone(), v)
        })
        .collect()
}

/// The standard base64 of `b` (xarray's encoding of a float `_FillValue`).
fn base64(b: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(b.len().div_ceil(3) * 4);
    for c in b.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(c.get(1).copied().unwrap_or(0)) << 8)
            | u32::from(c.get(2).copied().unwrap_or(0));
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= c.len() {
                out.push(A[(n >> shift) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The bytes of standard base64 `s` (None when it is not base64).
fn unbase64(s: &str) -> Option<Vec<u8>> {
    let val = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let t = s.trim_end_matches('=');
    if s.len() % 4 != 0 || s.len() - t.len() > 2 {
        return None;
    }
    let mut out = Vec::with_capacity(t.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for &c in t.as_bytes() {
        acc = (acc << 6) | val(c)?;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    Some(out)
}

/// xarray's Zarr v3 `_FillValue` attribute of a float array (the base64 of a
/// little-endian f64) as the number it stands for, in meta.json's form ("nan", "inf",
/// "-inf" for those): so the committed dataset's `_FillValue` is a number, as
/// xarray's netCDF writers store it. Other values are kept.
fn fill_attr_value(v: &Value) -> Value {
    let Some(b) = v.as_str().and_then(unbase64).filter(|b| b.len() == 8) else {
        return v.clone();
    };
    let mut a = [0u8; 8];
    a.copy_from_slice(&b);
    let x = f64::from_le_bytes(a);
    match x {
        x if x.is_nan() => json!("nan"),
        x if x == f64::INFINITY => json!("inf"),
        x if x == f64::NEG_INFINITY => json!("-inf"),
        x => json!(x),
    }
}

/// A float attribute value (JSON number, or our "nan"/"inf"/"-inf").
fn as_f64(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => match s.as_str() {
            "nan" => Some(f64::NAN),
            "inf" => Some(f64::INFINITY),
            "-inf" => Some(f64::NEG_INFINITY),
            _ => None,
        },
        _ => None,
    }
}

/// netCDF's `_FillValue` attribute in the form xarray reads from Zarr v3 attributes
/// (xarray's `FillValueCoder`): floats as the base64 of a little-endian f64, complex as
/// two of those, integers and bools as JSON; a one-element array as its element. So
/// `xr.open_zarr` masks fill values as `xr.open_dataset` does on the same file.
fn xarray_fill(v: &Value, data_type: &str) -> Value {
    let v = match v {
        Value::Array(a) if a.len() == 1 => &a[0],
        _ => v,
    };
    let b64 = |x: f64| json!(base64(&x.to_le_bytes()));
    match data_type {
        "float16" | "float32" | "float64" => as_f64(v).map_or(v.clone(), b64),
        "complex64" | "complex128" => match v.as_array().map(|a| a.as_slice()) {
            Some([re, im]) => match (as_f64(re), as_f64(im)) {
                (Some(r), Some(i)) => json!([b64(r), b64(i)]),
                _ => v.clone(),
            },
            _ => v.clone(),
        },
        "bool" => json!(v.as_bool().unwrap_or_else(|| v.as_i64().unwrap_or(0) != 0)),
        _ => v.clone(),
    }
}

/// A group's zarr.json, with the metadata of every member below it (`members`: keys
/// relative to the group, `a/b/x`, each a member's zarr.json as JSON) as zarr-python's
/// inline consolidated metadata, when given: zarr then lists the hierarchy from it and
/// not from the directories, whose links to groups (cycles) it would follow.
pub fn group_json(attrs: &Map<String, Value>, members: Option<Map<String, Value>>) -> Vec<u8> {
    let mut v = group_value(attrs);
    if let (Some(m), Some(o)) = (members, v.as_object_mut()) {
        o.insert("consolidated_metadata".into(), consolidated(m));
    }
    let mut b = serde_json::to_vec_pretty(&v).unwrap_or_default();
    b.push(b'\n');
    b
}

/// A group's metadata as JSON, without consolidated members.
pub fn group_value(attrs: &Map<String, Value>) -> Value {
    json!({
        "zarr_format": 3,
        "node_type": "group",
        "attributes": user_attrs(attrs),
    })
}

/// A subgroup's entry in consolidated metadata: its members are the parent's keys
/// below it, which zarr-python nests under it (as its own `consolidate_metadata` does).
pub fn consolidated_group_entry(attrs: &Map<String, Value>) -> Value {
    let mut v = group_value(attrs);
    if let Some(o) = v.as_object_mut() {
        o.insert("consolidated_metadata".into(), consolidated(Map::new()));
    }
    v
}

fn consolidated(metadata: Map<String, Value>) -> Value {
    json!({"kind": "inline", "must_understand": false, "metadata": metadata})
}

/// The Zarr v3 data type and byte order (None for one-byte types) of a NumPy dtype
/// string, or None when Zarr v3 has no data type for it.
pub fn data_type(descr: &str) -> Option<(&'static str, Option<&'static str>)> {
    let (order, code) = descr.split_at(1);
    let endian = match order {
        "<" => Some("little"),
        ">" => Some("big"),
        "|" | "=" => None,
        _ => return None,
    };
    let t = match code {
        "b1" => "bool",
        "i1" => "int8",
        "u1" => "uint8",
        "i2" => "int16",
        "u2" => "uint16",
        "i4" => "int32",
        "u4" => "uint32",
        "i8" => "int64",
        "u8" => "uint64",
        "f2" => "float16",
        "f4" => "float32",
        "f8" => "float64",
        "c8" => "complex64",
        "c16" => "complex128",
        _ => return None,
    };
    let one_byte = matches!(t, "bool" | "int8" | "uint8");
    Some((
        t,
        if one_byte {
            None
        } else {
            endian.or(Some("little"))
        },
    ))
}

/// The length of a NumPy fixed-width bytes dtype (`|S5`), served as zarr-python's
/// `null_terminated_bytes` data type (NumPy's `S`: trailing NULs are not part of a
/// value), with the stored bytes as they are.
pub fn bytes_length(descr: &str) -> Option<u64> {
    descr
        .strip_prefix("|S")
        .and_then(|n| n.parse::<u64>().ok())
        .filter(|&n| n > 0)
}

/// Why a dataset has no zarr.json, or None when it has one.
pub fn why_not(md: &ArrayInfo) -> Option<String> {
    let d = match &md.dtype {
        Ok(d) => d,
        Err(why) => return Some(why.clone()),
    };
    if nc_dimension_only(md.attrs) {
        return Some("a netCDF dimension without a variable".into());
    }
    match (data_type(d), bytes_length(d)) {
        (None, None) => Some(format!("Zarr v3 has no data type for NumPy dtype {d}")),
        _ => None,
    }
}

/// Whether a dataset with attributes `attrs` is netCDF-4's dimension without a variable.
pub fn nc_dimension_only(attrs: &Map<String, Value>) -> bool {
    attrs
        .get("NAME")
        .and_then(Value::as_str)
        .is_some_and(|n| n.starts_with(NC_DIM_ONLY))
}

/// The dataset's dimension names: netCDF-4's dimension scales (the last component of
/// each dimension's first attached scale; a scale names its own dimension).
fn dimension_names(md: &ArrayInfo) -> Option<Vec<Value>> {
    let rank = md.shape.len();
    if rank == 0 {
        return None;
    }
    if let Some(Value::Array(dims)) = md.attrs.get("DIMENSION_LIST") {
        if dims.len() != rank {
            return None;
        }
        let names: Vec<Value> = dims
            .iter()
            .map(|d| {
                d.as_array()
                    .and_then(|a| a.first())
                    .and_then(Value::as_str)
                    .and_then(|p| p.rsplit('/').next())
                    .map_or(Value::Null, |n| json!(n))
            })
            .collect();
        return Some(names);
    }
    let is_scale = md.attrs.get("CLASS").and_then(Value::as_str) == Some("DIMENSION_SCALE");
    if is_scale && rank == 1 {
        let own = md.name.rsplit('/').next().unwrap_or(md.name);
        return Some(vec![json!(own)]);
    }
    None
}

/// The fill value in Zarr's JSON form (non-finite floats as "NaN", "Infinity",
/// "-Infinity"); zero of the type when the dataset defines none.
fn fill_value(md: &ArrayInfo, t: &str) -> Value {
    let f = md.fill.clone();
    let zero = match t {
        "bool" => json!(false),
        "float16" | "float32" | "float64" => json!(0.0),
        "complex64" | "complex128" => json!([0.0, 0.0]),
        _ => json!(0),
    };
    let fix = |v: &Value| match v.as_str() {
        Some("nan") => json!("NaN"),
        Some("inf") => json!("Infinity"),
        Some("-inf") => json!("-Infinity"),
        _ => v.clone(),
    };
    match (&f, t) {
        (Value::Null, _) => zero,
        (Value::Array(a), _) => Value::Array(a.iter().map(fix).collect()),
        (Value::Number(n), "bool") => json!(n.as_u64().unwrap_or(0) != 0),
        // a bitfield or enum shown as bool in meta.json, served as its integer
        (Value::Bool(b), _) if t != "bool" => json!(u8::from(*b)),
        _ => fix(&f),
    }
}

fn array_attrs(md: &ArrayInfo, data_type: &str) -> Map<String, Value> {
    let mut a = user_attrs(md.attrs);
    if let Some(v) = a.get_mut("_FillValue") {
        *v = xarray_fill(v, data_type);
    }
    // netCDF's (and h5py's) variable-length strings are text: xarray decodes bytes with
    // an `_Encoding` as netCDF4-python decodes them.
    // Shown as unicode, they need no decoding (and xarray would decode them again).
    if md.text_chars().is_some() {
        a.remove("_Encoding");
    } else if md.vlen_str && !a.contains_key("_Encoding") {
        a.insert("_Encoding".into(), json!("utf-8"));
    }
    a
}

/// A string's fill value as text (its bytes up to the first NUL).
fn text_fill(fill: &[u8]) -> String {
    let end = fill.iter().position(|&b| b == 0).unwrap_or(fill.len());
    String::from_utf8_lossy(&fill[..end]).into_owned()
}

/// A dataset's zarr.json, or None when Zarr cannot show it ([`why_not`]).
pub fn array_json(md: &ArrayInfo) -> Option<Vec<u8>> {
    if why_not(md).is_some() {
        return None;
    }
    let descr = md.dtype.as_ref().ok()?;
    let (t, ty, endian, fill) = match (data_type(descr), bytes_length(descr)) {
        _ if md.text_chars().is_some() => (
            "text",
            json!({"name": "fixed_length_utf32",
                   "configuration": {"length_bytes": md.zarr_itemsize()}}),
            Some("little"),
            json!(text_fill(md.fill_bytes)),
        ),
        (Some((t, endian)), _) => (t, json!(t), endian, fill_value(md, t)),
        (None, Some(n)) => (
            "bytes",
            json!({"name": "null_terminated_bytes", "configuration": {"length_bytes": n}}),
            None,
            json!(base64(md.fill_bytes)),
        ),
        (None, None) => return None,
    };
    let bytes = match endian {
        Some(e) => json!({"name": "bytes", "configuration": {"endian": e}}),
        None => json!({"name": "bytes"}),
    };
    let mut v = json!({
        "zarr_format": 3,
        "node_type": "array",
        "shape": md.shape,
        "data_type": ty,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": md.tile_shape}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": fill,
        "codecs": [bytes],
        "attributes": array_attrs(md, t),
    });
    if let (Some(names), Some(o)) = (dimension_names(md), v.as_object_mut()) {
        o.insert("dimension_names".into(), Value::Array(names));
    }
    let mut b = serde_json::to_vec_pretty(&v).ok()?;
    b.push(b'\n');
    Some(b)
}

/// The size of every chunk file: the full chunk (tile) shape times the element size.
pub fn chunk_bytes(tile_shape: &[u64], itemsize: u64) -> u64 {
    tile_shape
        .iter()
        .fold(itemsize, |a, &t| a.saturating_mul(t))
}

/// Whether tile `idx` is smaller than the chunk shape (an edge chunk Zarr wants padded).
pub fn is_edge(shape: &[u64], tile_shape: &[u64], idx: &[u64]) -> bool {
    idx.iter()
        .zip(tile_shape.iter().zip(shape))
        .any(|(&i, (&t, &n))| i.saturating_add(1).saturating_mul(t) > n)
}

/// Lays the C-order bytes `clipped` of an edge tile of `count` elements per dimension
/// into a full chunk of `chunk` elements per dimension, the rest filled with `fill`
/// (one element's bytes).
pub fn pad(clipped: &[u8], count: &[u64], chunk: &[u64], es: usize, fill: &[u8]) -> Vec<u8> {
    let total: usize = chunk.iter().map(|&c| c as usize).product::<usize>() * es;
    let mut out = vec![0u8; total];
    if fill.len() == es && fill.iter().any(|&b| b != 0) {
        for c in out.chunks_exact_mut(es) {
            c.copy_from_slice(fill);
        }
    }
    let rank = count.len();
    if rank == 0 {
        let n = clipped.len().min(out.len());
        out[..n].copy_from_slice(&clipped[..n]);
        return out;
    }
    let row = count[rank - 1] as usize * es;
    let rows: usize = count[..rank - 1].iter().map(|&c| c as usize).product();
    // Strides of the full chunk, in elements.
    let mut stride = vec![1usize; rank];
    for d in (0..rank - 1).rev() {
        stride[d] = stride[d + 1] * chunk[d + 1] as usize;
    }
    let mut idx = vec![0usize; rank.saturating_sub(1)];
    for r in 0..rows {
        let dst = idx.iter().zip(&stride).map(|(&i, &s)| i * s).sum::<usize>() * es;
        let src = r * row;
        if let (Some(d), Some(s)) = (out.get_mut(dst..dst + row), clipped.get(src..src + row)) {
            d.copy_from_slice(s);
        }
        for d in (0..idx.len()).rev() {
            idx[d] += 1;
            if idx[d] < count[d] as usize {
                break;
            }
            idx[d] = 0;
        }
    }
    out
}

/// What a Zarr writer must do instead, in every refusal of a zarr.json.
const WRITE_FIX: &str = "h5tilefs takes Zarr v3 arrays with codecs [bytes], [bytes, zstd], \
    [bytes, gzip] or [bytes, blosc] (zarr-python: create_array(..., filters=None) with the \
    default compressors, compressors=GzipCodec(...), BloscCodec(...) or None), the default \
    chunk key encoding with separator \"/\" and a numeric or bool data_type; a compressed \
    array is committed as a chunked dataset with HDF5's filter of the same codec";

/// The meta.json declaration (see staging.rs) a Zarr v3 array's zarr.json written into
/// a pending dataset's directory stands for: shape, dtype with the `bytes` codec's byte
/// order, the chunk shape as tile shape, the fill value, the attributes, and
/// `unwritten_tiles: fill` (Zarr skips chunks equal to the fill value). Anything the
/// committed VDS cannot keep as Zarr wrote it (compression, other codecs, storage
/// transformers, other chunk key encodings) is refused with the fix.
pub fn declaration(bytes: &[u8]) -> Result<Value, String> {
    let v: Value =
        serde_json::from_slice(bytes).map_err(|e| format!("zarr.json is not valid JSON: {e}"))?;
    let o = v.as_object().ok_or("zarr.json must be a JSON object")?;
    if o.get("zarr_format").and_then(Value::as_u64) != Some(3) {
        return Err(format!("only zarr_format 3 is taken: {WRITE_FIX}"));
    }
    match o.get("node_type").and_then(Value::as_str) {
        Some("array") => {}
        Some("group") => {
            return Err(
                "a Zarr group cannot be written here: open the store at the \
                dataset's path (MNT/file.h5/group/name) and create an array there; \
                groups are made by mkdir"
                    .into(),
            )
        }
        _ => return Err("zarr.json needs node_type \"array\"".into()),
    }
    let shape = o.get("shape").cloned().ok_or("zarr.json needs \"shape\"")?;
    let chunks = o
        .get("chunk_grid")
        .filter(|g| g.get("name").and_then(Value::as_str) == Some("regular"))
        .and_then(|g| g.get("configuration")?.get("chunk_shape"))
        .cloned()
        .ok_or_else(|| format!("only a regular chunk grid is taken: {WRITE_FIX}"))?;
    let enc = o.get("chunk_key_encoding");
    let enc_ok = enc.is_none_or(|e| {
        e.get("name").and_then(Value::as_str) == Some("default")
            && e.get("configuration")
                .and_then(|c| c.get("separator"))
                .and_then(Value::as_str)
                .is_none_or(|s| s == "/")
    });
    if !enc_ok {
        return Err(format!(
            "chunk key encoding {}: {WRITE_FIX}",
            enc.map(Value::to_string).unwrap_or_default()
        ));
    }
    if o.get("storage_transformers")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty())
    {
        return Err(format!("storage transformers are not taken: {WRITE_FIX}"));
    }
    let codecs = o
        .get("codecs")
        .and_then(Value::as_array)
        .ok_or("zarr.json needs \"codecs\"")?;
    let names: Vec<&str> = codecs
        .iter()
        .map(|c| c.get("name").and_then(Value::as_str).unwrap_or("?"))
        .collect();
    let compression = match names.as_slice() {
        ["bytes"] => None,
        ["bytes", "zstd" | "gzip" | "blosc"] => Some(compressor(&codecs[1])?),
        _ => {
            return Err(format!(
                "codecs {names:?} cannot be written through the mount: {WRITE_FIX}"
            ))
        }
    };
    let endian = codecs[0]
        .get("configuration")
        .and_then(|c| c.get("endian"))
        .and_then(Value::as_str)
        .unwrap_or("little");
    let order = match endian {
        "little" => '<',
        "big" => '>',
        e => {
            return Err(format!(
                "bytes codec endian {e:?} is neither little nor big"
            ))
        }
    };
    let t = o.get("data_type").and_then(Value::as_str).unwrap_or("");
    let code = match t {
        "bool" => "b1",
        "int8" => "i1",
        "uint8" => "u1",
        "int16" => "i2",
        "uint16" => "u2",
        "int32" => "i4",
        "uint32" => "u4",
        "int64" => "i8",
        "uint64" => "u8",
        "float16" => "f2",
        "float32" => "f4",
        "float64" => "f8",
        "complex64" => "c8",
        "complex128" => "c16",
        _ => return Err(format!("data_type {t:?}: {WRITE_FIX}")),
    };
    let dtype = if matches!(code, "b1" | "i1" | "u1") {
        format!("|{code}")
    } else {
        format!("{order}{code}")
    };
    let fill = match o.get("fill_value") {
        None | Some(Value::Null) => Value::Null,
        Some(Value::String(s)) if s.starts_with("0x") => {
            return Err(format!(
                "fill_value {s:?} (raw bits) is not taken: give it as a number"
            ))
        }
        Some(f) => f.clone(),
    };
    let mut attrs = match o.get("attributes") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(_) => return Err("zarr.json attributes must be a JSON object".into()),
    };
    if let Some(f) = attrs.get_mut("_FillValue") {
        if matches!(t, "float16" | "float32" | "float64") {
            *f = fill_attr_value(f);
        }
    }
    let mut decl = json!({
        "shape": shape,
        "dtype": dtype,
        "tile_shape": chunks,
        "fill_value": fill,
        "attrs": attrs,
        "unwritten_tiles": "fill",
    });
    match o.get("dimension_names") {
        None | Some(Value::Null) => {}
        Some(Value::Array(names)) if names.iter().any(|n| !n.is_null()) => {
            if let Some(d) = decl.as_object_mut() {
                d.insert("dims".into(), Value::Array(names.clone()));
            }
        }
        Some(Value::Array(_)) => {}
        Some(_) => return Err("zarr.json dimension_names must be a list".into()),
    }
    if let (Some((name, level)), Some(d)) = (compression, decl.as_object_mut()) {
        d.insert("layout".into(), json!("chunked"));
        d.insert("compression".into(), json!(name));
        d.insert("compression_opts".into(), json!(level));
    }
    Ok(decl)
}

/// The meta.json compression (h5py's name and options) of Zarr's `zstd`, `gzip` or
/// `blosc` codec: its level as Zarr gave it, a zstd level of 0 (libzstd's "default") as
/// 3, the level it means, so the HDF5 filter states it; Blosc's compressor, level and
/// shuffle (its type size is the data type's, its block size Blosc's own choice).
fn compressor(codec: &Value) -> Result<(&'static str, Value), String> {
    let name = codec.get("name").and_then(Value::as_str).unwrap_or("?");
    if name == "blosc" {
        let c = codec.get("configuration");
        let mut o = serde_json::Map::new();
        for k in ["cname", "clevel", "shuffle"] {
            if let Some(v) = c.and_then(|c| c.get(k)).filter(|v| !v.is_null()) {
                o.insert(k.into(), v.clone());
            }
        }
        return Ok(("blosc", Value::Object(o)));
    }
    let level = codec.get("configuration").and_then(|c| c.get("level"));
    let level = match level {
        None | Some(Value::Null) => None,
        Some(l) => Some(
            l.as_i64()
                .ok_or_else(|| format!("{name} codec level {l} is not an integer"))?,
        ),
    };
    Ok(match name {
        "zstd" => ("zstd", json!(level.filter(|&l| l != 0).unwrap_or(3))),
        _ => ("gzip", json!(level.unwrap_or(5))),
    })
}

/// Where the bytes of a chunk file lie in its tile: for the byte range `[off, off +
/// len)` of a chunk of `chunk` elements per dimension whose tile (clipped at the
/// array's edge) has `tile` elements per dimension, the runs `(chunk offset, tile
/// offset, length)` that fall inside the tile; padding falls in none.
pub fn chunk_runs(
    chunk: &[u64],
    tile: &[u64],
    es: u64,
    off: u64,
    len: u64,
) -> Vec<(u64, u64, u64)> {
    let end = off.saturating_add(len);
    let rank = chunk.len();
    if rank == 0 || chunk == tile {
        let total = chunk_bytes(tile, es);
        let e = end.min(total);
        return if off < e {
            vec![(off, off, e - off)]
        } else {
            vec![]
        };
    }
    let crow = chunk[rank - 1].saturating_mul(es);
    let trow = tile[rank - 1].saturating_mul(es);
    let mut out = Vec::new();
    if crow == 0 {
        return out;
    }
    let mut r = off / crow;
    loop {
        let rstart = r.saturating_mul(crow);
        if rstart >= end {
            break;
        }
        // the row's multi-index over the leading dimensions, in the chunk
        let mut rem = r;
        let mut inside = true;
        let mut lin = 0u64;
        let mut idx = vec![0u64; rank - 1];
        for d in (0..rank - 1).rev() {
            idx[d] = rem % chunk[d];
            rem /= chunk[d];
        }
        if rem > 0 {
            break;
        }
        for d in 0..rank - 1 {
            if idx[d] >= tile[d] {
                inside = false;
                break;
            }
            lin = lin * tile[d] + idx[d];
        }
        if inside {
            let (s, e) = (off.max(rstart), end.min(rstart + trow));
            if s < e {
                out.push((s, lin * trow + (s - rstart), e - s));
            }
        }
        r += 1;
    }
    out
}

/// The chunk index a chunk file name under `c/` stands for, one component per level.
pub fn parse_index(name: &str, bound: u64) -> Option<u64> {
    if name.is_empty()
        || (name.len() > 1 && name.starts_with('0'))
        || !name.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    name.parse::<u64>().ok().filter(|&i| i < bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_types_and_byte_order() {
        assert_eq!(data_type("<f4"), Some(("float32", Some("little"))));
        assert_eq!(data_type(">i2"), Some(("int16", Some("big"))));
        assert_eq!(data_type("|b1"), Some(("bool", None)));
        assert_eq!(data_type("|u1"), Some(("uint8", None)));
        assert_eq!(data_type("<c16"), Some(("complex128", Some("little"))));
        assert_eq!(data_type("|S4"), None);
        assert_eq!(data_type("<f16"), None);
    }

    #[test]
    fn one_element_attributes_are_scalars_and_strings_are_bytes() {
        let attrs: Map<String, Value> = serde_json::from_value(json!({
            "scale_factor": [0.01], "valid_range": [0, 10], "units": "K",
            "DIMENSION_LIST": [["/t"]], "_FillValue": [-1]
        }))
        .unwrap();
        let a = user_attrs(&attrs);
        assert_eq!(a["scale_factor"], json!(0.01));
        assert_eq!(a["valid_range"], json!([0, 10]));
        assert!(!a.contains_key("DIMENSION_LIST"));
        assert_eq!(bytes_length("|S5"), Some(5));
        assert_eq!(bytes_length("|S0"), None);
        assert_eq!(bytes_length("<f4"), None);
        let (shape, tiles) = ([3u64], [2u64]);
        let md = ArrayInfo {
            name: "/s",
            shape: &shape,
            tile_shape: &tiles,
            itemsize: 5,
            dtype: Ok("|S5".into()),
            attrs: &attrs,
            fill: Value::Null,
            fill_bytes: &[0; 5],
            vlen_str: true,
            text_chars: None,
        };
        let z: Value = serde_json::from_slice(&array_json(&md).unwrap()).unwrap();
        assert_eq!(z["data_type"]["name"], "null_terminated_bytes");
        assert_eq!(z["data_type"]["configuration"]["length_bytes"], 5);
        assert_eq!(z["fill_value"], "AAAAAAA=");
        assert_eq!(z["attributes"]["_Encoding"], "utf-8");
        assert_eq!(z["codecs"], json!([{"name": "bytes"}]));
        // UTF-8 throughout: NumPy unicode, as netCDF readers give them
        let text = ArrayInfo {
            text_chars: Some(4),
            ..md
        };
        let z: Value = serde_json::from_slice(&array_json(&text).unwrap()).unwrap();
        assert_eq!(z["data_type"]["name"], "fixed_length_utf32");
        assert_eq!(z["data_type"]["configuration"]["length_bytes"], 16);
        assert_eq!(z["fill_value"], "");
        assert!(z["attributes"].get("_Encoding").is_none());
        assert_eq!(
            z["codecs"],
            json!([{"name": "bytes", "configuration": {"endian": "little"}}])
        );
        assert_eq!(text.zarr_itemsize(), 16);
        let wide = [1u64 << 30];
        let huge = ArrayInfo {
            tile_shape: &wide,
            ..text
        };
        assert_eq!(
            huge.text_chars(),
            None,
            "chunks over the cap keep the bytes form"
        );
        let g: Value = serde_json::from_slice(&group_json(&attrs, Some(Map::new()))).unwrap();
        assert_eq!(g["consolidated_metadata"]["kind"], "inline");
        assert_eq!(g["attributes"]["scale_factor"], json!(0.01));
    }

    #[test]
    fn utf32_transcodes_nul_padded_text() {
        let src = b"ab\0\0d\xc3\xa9\0\xff\0\0\0";
        let out = utf32(src, 4, 2);
        let want: Vec<u8> = ['a', 'b', 'd', '\u{e9}', '\u{fffd}', '\0']
            .iter()
            .flat_map(|&c| u32::from(c).to_le_bytes())
            .collect();
        assert_eq!(out, want);
        assert!(utf32(b"", 0, 3).is_empty());
    }

    #[test]
    fn pad_places_rows_and_fills_the_rest() {
        // A 2 x 3 tile of u8 in a 3 x 4 chunk, fill 9.
        let clipped = [1, 2, 3, 4, 5, 6];
        let out = pad(&clipped, &[2, 3], &[3, 4], 1, &[9]);
        assert_eq!(out, vec![1, 2, 3, 9, 4, 5, 6, 9, 9, 9, 9, 9]);
        // 3-d, two-byte elements, zero fill.
        let clipped: Vec<u8> = (1..=8).collect(); // 1 x 2 x 2 elements of 2 bytes
        let out = pad(&clipped, &[1, 2, 2], &[2, 2, 3], 2, &[0, 0]);
        assert_eq!(&out[..12], &[1, 2, 3, 4, 0, 0, 5, 6, 7, 8, 0, 0]);
        assert!(out[12..].iter().all(|&b| b == 0));
    }

    #[test]
    fn base64_and_xarray_fill() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
        // struct.pack("<d", -999.0) in Python, base64: "AAAAAAA4j8A="
        assert_eq!(
            xarray_fill(&json!([-999.0]), "float32"),
            json!("AAAAAAA4j8A=")
        );
        assert_eq!(xarray_fill(&json!([-32767]), "int16"), json!(-32767));
    }

    #[test]
    fn chunk_runs_drop_the_padding() {
        // interior chunk: one run
        assert_eq!(chunk_runs(&[2, 3], &[2, 3], 1, 0, 6), vec![(0, 0, 6)]);
        assert_eq!(chunk_runs(&[2, 3], &[2, 3], 1, 4, 10), vec![(4, 4, 2)]);
        // a 2 x 3 tile in a 3 x 4 chunk of u8: rows of 3 at chunk offsets 0 and 4
        assert_eq!(
            chunk_runs(&[3, 4], &[2, 3], 1, 0, 12),
            vec![(0, 0, 3), (4, 3, 3)]
        );
        // a write that starts inside a row and stops inside the next
        assert_eq!(
            chunk_runs(&[3, 4], &[2, 3], 1, 1, 5),
            vec![(1, 1, 2), (4, 3, 2)]
        );
        // padding only
        assert!(chunk_runs(&[3, 4], &[2, 3], 1, 8, 4).is_empty());
        // 3-d with 2-byte elements: tile 1 x 2 x 2 in chunk 2 x 2 x 3
        assert_eq!(
            chunk_runs(&[2, 2, 3], &[1, 2, 2], 2, 0, 24),
            vec![(0, 0, 4), (6, 4, 4)]
        );
        // it undoes `pad`
        let clipped: Vec<u8> = (1..=8).collect();
        let padded = pad(&clipped, &[1, 2, 2], &[2, 2, 3], 2, &[0, 0]);
        let mut back = vec![0u8; 8];
        for (c, t, n) in chunk_runs(&[2, 2, 3], &[1, 2, 2], 2, 0, padded.len() as u64) {
            back[t as usize..(t + n) as usize]
                .copy_from_slice(&padded[c as usize..(c + n) as usize]);
        }
        assert_eq!(back, clipped);
    }

    #[test]
    fn zarr_json_declares_a_dataset() {
        let z = br#"{"zarr_format":3,"node_type":"array","shape":[5,7],"data_type":"float32",
            "chunk_grid":{"name":"regular","configuration":{"chunk_shape":[2,3]}},
            "chunk_key_encoding":{"name":"default","configuration":{"separator":"/"}},
            "fill_value":"NaN","codecs":[{"name":"bytes","configuration":{"endian":"big"}}],
            "attributes":{"units":"m"}}"#;
        let d = declaration(z).unwrap();
        assert_eq!(d["dtype"], "<f4".replace('<', ">"));
        assert_eq!(d["tile_shape"], json!([2, 3]));
        assert_eq!(d["fill_value"], "NaN");
        assert_eq!(d["unwritten_tiles"], "fill");
        let zstd = String::from_utf8_lossy(z).replace(
            r#"[{"name":"bytes","configuration":{"endian":"big"}}]"#,
            r#"[{"name":"bytes"},{"name":"zstd","configuration":{"level":0}}]"#,
        );
        let d = declaration(zstd.as_bytes()).unwrap();
        assert_eq!(d["layout"], "chunked");
        assert_eq!(d["compression"], "zstd");
        assert_eq!(d["compression_opts"], 3);
        let gzip = zstd.replace(
            r#""zstd","configuration":{"level":0}"#,
            r#""gzip","configuration":{"level":7}"#,
        );
        let d = declaration(gzip.as_bytes()).unwrap();
        assert_eq!(
            (&d["compression"], &d["compression_opts"]),
            (&json!("gzip"), &json!(7))
        );
        let blosc = zstd.replace(
            r#""zstd","configuration":{"level":0}"#,
            r#""blosc","configuration":{"typesize":4,"cname":"zstd","clevel":5,"shuffle":"bitshuffle","blocksize":0}"#,
        );
        let d = declaration(blosc.as_bytes()).unwrap();
        assert_eq!(
            (&d["compression"], &d["compression_opts"]),
            (
                &json!("blosc"),
                &json!({"cname": "zstd", "clevel": 5, "shuffle": "bitshuffle"})
            )
        );
        // a checksum, a transpose or two compressors: refused, naming the codecs and
        // what is taken
        for codecs in [
            r#"[{"name":"bytes"},{"name":"crc32c"}]"#,
            r#"[{"name":"transpose","configuration":{"order":[1,0]}},{"name":"bytes"},{"name":"zstd"}]"#,
            r#"[{"name":"bytes"},{"name":"zstd"},{"name":"gzip"}]"#,
        ] {
            let z = String::from_utf8_lossy(z).replace(
                r#"[{"name":"bytes","configuration":{"endian":"big"}}]"#,
                codecs,
            );
            let e = declaration(z.as_bytes()).unwrap_err();
            assert!(e.contains("[bytes, zstd]") && e.contains("codecs ["), "{e}");
        }
        let e = declaration(
            zstd.replace("{\"level\":0}", "{\"level\":\"high\"}")
                .as_bytes(),
        )
        .unwrap_err();
        assert!(e.contains("level"), "{e}");
        let dot = String::from_utf8_lossy(z).replace(r#""separator":"/""#, r#""separator":".""#);
        assert!(declaration(dot.as_bytes()).is_err());
        assert!(declaration(br#"{"zarr_format":3,"node_type":"group"}"#).is_err());
    }

    #[test]
    fn chunk_index_names() {
        assert_eq!(parse_index("0", 3), Some(0));
        assert_eq!(parse_index("2", 3), Some(2));
        assert_eq!(parse_index("3", 3), None);
        assert_eq!(parse_index("01", 3), None);
        assert_eq!(parse_index("", 3), None);
        assert_eq!(parse_index("-1", 3), None);
    }
}
