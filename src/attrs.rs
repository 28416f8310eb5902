//! Attributes (of datasets and groups) and fill values as JSON, for meta.json and zarr.json.

use crate::h5::{self, StrPad, Ty};
use serde_json::{json, Map, Value};

/// Every attribute that maps to JSON (numbers, bools, complex, strings, arrays of them).
/// Others are left out, with a debug log.
pub fn read_attrs(ds: &hdf5::Location) -> Map<String, Value> {
    let mut out = Map::new();
    let names = match ds.attr_names() {
        Ok(n) => n,
        Err(e) => {
            tracing::debug!(file = %ds.filename(), object = %ds.name(), error = %e, "listing attributes failed");
            return out;
        }
    };
    for name in names {
        match read_attr(ds, &name) {
            Some(v) => {
                out.insert(name, v);
            }
            None => tracing::debug!(
                file = %ds.filename(),
                object = %ds.name(),
                attr = %name,
                "attribute not representable as JSON"
            ),
        }
    }
    out
}

pub fn read_attr(ds: &hdf5::Location, name: &str) -> Option<Value> {
    let attr = ds.attr(name).ok()?;
    let shape = attr.shape();
    let scalar = attr.is_scalar();
    let (t, bytes, n) = h5::read_attr_raw(attr.id()).ok()?;
    let loc = ds.id();
    let refname = |r: &[u8]| h5::ref_name(loc, r).map_or(Value::Null, Value::String);
    let values: Vec<Value> = match h5::string_kind(&t) {
        Some(true) => {
            if let Ok(v) = attr.read_raw::<hdf5::types::VarLenUnicode>() {
                v.iter().map(|s| json!(s.as_str())).collect()
            } else {
                attr.read_raw::<hdf5::types::VarLenAscii>()
                    .ok()?
                    .iter()
                    .map(|s| json!(s.as_str()))
                    .collect()
            }
        }
        _ if h5::is_vlen_of_refs(&t) => {
            // netCDF's DIMENSION_LIST: per dimension, the dimension scales' paths.
            h5::read_attr_vlen_refs(attr.id())
                .ok()?
                .iter()
                .map(|refs| Value::Array(refs.iter().map(|r| refname(r)).collect()))
                .collect()
        }
        _ => {
            let ty = h5::describe_type(&t).ok()?;
            let size = ty.itemsize() as usize;
            if size == 0 {
                return None;
            }
            bytes
                .chunks(size)
                .map(|c| value_json(&ty, c, Some(&refname)))
                .collect()
        }
    };
    if scalar {
        return values.into_iter().next();
    }
    if values.len() != n {
        return None;
    }
    // An empty attribute can still claim a huge shape such as (2^20, 2^20, 0): nesting
    // it would build 2^40 empty lists. Such attributes are left out of meta.json.
    let lists = shape
        .iter()
        .take(shape.len().saturating_sub(1))
        .try_fold(1usize, |a, &d| a.checked_mul(d));
    if lists.is_none_or(|l| l > MAX_NESTED_LISTS) {
        return None;
    }
    Some(nest(&values, &shape))
}

/// Resolves an object reference's bytes to the referenced object's path.
pub type RefName<'a> = &'a dyn Fn(&[u8]) -> Value;

/// One element of type `ty` (its file bytes) as JSON: numbers, true/false for bools
/// and 1-byte bitfields, strings (padding removed, embedded NULs kept), compounds as
/// objects, arrays as lists, enums as their integer value, object references as the
/// referenced object's path (through `refname`, null without it).
pub fn value_json(ty: &Ty, b: &[u8], refname: Option<RefName>) -> Value {
    match ty {
        // PyTables stores bools as 1-byte bitfields.
        Ty::Bitfield(d) if d == "|u1" => json!(b.first().is_some_and(|&c| c != 0)),
        Ty::Scalar(d) | Ty::Bitfield(d) | Ty::Enum { base: d, .. } => scalar_json(d, b),
        Ty::Str { size, pad, .. } => {
            let s = &b[..(*size as usize).min(b.len())];
            let strip = if *pad == StrPad::SpacePad { b' ' } else { 0 };
            let end = s.iter().rposition(|&c| c != strip).map_or(0, |p| p + 1);
            json!(String::from_utf8_lossy(&s[..end]))
        }
        Ty::VStr { .. } => Value::Null,
        Ty::ObjRef => refname.map_or(Value::Null, |f| f(b)),
        Ty::Compound { fields, .. } => {
            let mut m = Map::new();
            for (name, off, ft) in fields {
                let off = *off as usize;
                let end = off.saturating_add(ft.itemsize() as usize);
                let v = b
                    .get(off..end)
                    .map_or(Value::Null, |c| value_json(ft, c, refname));
                m.insert(name.clone(), v);
            }
            Value::Object(m)
        }
        Ty::Array { dims, base } => {
            let es = base.itemsize() as usize;
            if es == 0 {
                return Value::Null;
            }
            let vals: Vec<Value> = b.chunks(es).map(|c| value_json(base, c, refname)).collect();
            let shape: Vec<usize> = dims.iter().map(|&d| d as usize).collect();
            nest(&vals, &shape)
        }
    }
}

/// Most nested lists one attribute's JSON may have.
const MAX_NESTED_LISTS: usize = 1 << 20;

fn nest(values: &[Value], shape: &[usize]) -> Value {
    match shape {
        [] => values.first().cloned().unwrap_or(Value::Null),
        [_] => Value::Array(values.to_vec()),
        [n, rest @ ..] => {
            let inner: usize = rest.iter().product();
            Value::Array(
                (0..*n)
                    .map(|i| nest(&values[i * inner..(i + 1) * inner], rest))
                    .collect(),
            )
        }
    }
}

fn float_json(v: f64) -> Value {
    if v.is_finite() {
        json!(v)
    } else if v.is_nan() {
        json!("nan")
    } else if v > 0.0 {
        json!("inf")
    } else {
        json!("-inf")
    }
}

/// IEEE half precision to f64.
fn f16_to_f64(h: u16) -> f64 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exp = ((h >> 10) & 0x1f) as i32;
    let frac = (h & 0x3ff) as f64;
    match exp {
        0 => sign * frac * 2f64.powi(-24),
        31 if frac == 0.0 => sign * f64::INFINITY,
        31 => f64::NAN,
        _ => sign * (1.0 + frac / 1024.0) * 2f64.powi(exp - 15),
    }
}

/// One element of NumPy type `descr` (e.g. `<f4`, `>i2`, `|b1`, `<c8`) as JSON.
pub fn scalar_json(descr: &str, b: &[u8]) -> Value {
    let mut chars = descr.chars();
    let (Some(order), Some(kind)) = (chars.next(), chars.next()) else {
        return Value::Null;
    };
    let size: usize = chars.as_str().parse().unwrap_or(0);
    if b.len() < size || size == 0 {
        return Value::Null;
    }
    let mut v = b[..size].to_vec();
    if order == '>' {
        v.reverse();
    }
    let le = |n: usize| -> u64 {
        let mut a = [0u8; 8];
        a[..n].copy_from_slice(&v[..n]);
        u64::from_le_bytes(a)
    };
    match (kind, size) {
        ('b', 1) => json!(v[0] != 0),
        ('u', n @ (1 | 2 | 4 | 8)) => json!(le(n)),
        ('i', n @ (1 | 2 | 4 | 8)) => {
            let shift = 64 - 8 * n as u32;
            json!(((le(n) << shift) as i64) >> shift)
        }
        ('f', 2) => float_json(f16_to_f64(le(2) as u16)),
        ('f', 4) => float_json(f32::from_bits(le(4) as u32) as f64),
        ('f', 8) => float_json(f64::from_bits(le(8))),
        ('c', 8 | 16) => {
            let half = size / 2;
            let part = |p: &[u8]| scalar_json(&format!("{order}f{half}"), p);
            json!([part(&b[..half]), part(&b[half..size])])
        }
        _ => Value::Null,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalars() {
        assert_eq!(scalar_json("<i4", &(-5i32).to_le_bytes()), json!(-5));
        assert_eq!(scalar_json(">i4", &(-5i32).to_be_bytes()), json!(-5));
        assert_eq!(scalar_json("<u8", &7u64.to_le_bytes()), json!(7));
        assert_eq!(scalar_json("<f8", &1.5f64.to_le_bytes()), json!(1.5));
        assert_eq!(scalar_json(">f4", &2.5f32.to_be_bytes()), json!(2.5));
        assert_eq!(scalar_json("<f2", &0x3c00u16.to_le_bytes()), json!(1.0));
        assert_eq!(scalar_json("|b1", &[1]), json!(true));
        assert_eq!(scalar_json("<f4", &f32::NAN.to_le_bytes()), json!("nan"));
        let mut c = 1.0f32.to_le_bytes().to_vec();
        c.extend(2.0f32.to_le_bytes());
        assert_eq!(scalar_json("<c8", &c), json!([1.0, 2.0]));
        assert_eq!(scalar_json("<f16", &[0; 16]), Value::Null);
    }

    /// An empty attribute of shape (2^20, 2^20, 0) is left out at once; it used to build
    /// 2^40 empty lists (meta.json hung). A small empty one still nests.
    #[test]
    fn empty_attribute_with_a_huge_shape_is_left_out() {
        let d = tempfile::tempdir().unwrap();
        let f = hdf5::File::create(d.path().join("a.h5")).unwrap();
        let ds = f.new_dataset::<i32>().shape([2]).create("x").unwrap();
        ds.new_attr::<i32>()
            .shape([1 << 20, 1 << 20, 0])
            .create("huge")
            .unwrap();
        ds.new_attr::<i32>().shape([2, 0]).create("small").unwrap();
        let t0 = std::time::Instant::now();
        assert_eq!(read_attr(&ds, "huge"), None);
        assert!(t0.elapsed().as_secs() < 2);
        assert_eq!(read_attr(&ds, "small"), Some(json!([[], []])));
    }

    /// A compound stored with its members out of order and a space-padded string:
    /// numpy's dict form keeps the offsets, the string makes reads convert, and the
    /// JSON of an element names every member.
    #[test]
    fn compound_with_spacepad_string() {
        use hdf5_sys::h5t;
        // SAFETY: types built here and closed by their guards.
        let (t, s) = hdf5::sync::sync(|| unsafe {
            let s = h5::Hid::from_raw(h5t::H5Tcopy(*h5t::H5T_C_S1), h5t::H5Tclose);
            h5t::H5Tset_size(s.id(), 4);
            h5t::H5Tset_strpad(s.id(), h5t::H5T_str_t::H5T_STR_SPACEPAD);
            let t = h5::Hid::from_raw(
                h5t::H5Tcreate(hdf5_sys::h5t::H5T_class_t::H5T_COMPOUND, 16),
                h5t::H5Tclose,
            );
            h5t::H5Tinsert(t.id(), c"n".as_ptr(), 8, *h5t::H5T_STD_I32BE);
            h5t::H5Tinsert(t.id(), c"s".as_ptr(), 0, s.id());
            (t, s)
        });
        let ty = h5::describe_type(&t).unwrap();
        assert_eq!(
            ty.numpy(0),
            json!({"names": ["n", "s"], "formats": [">i4", "|S4"], "offsets": [8, 0], "itemsize": 16})
        );
        assert!(ty.converts());
        assert_eq!(ty.itemsize(), 16);
        let mut b = vec![0u8; 16];
        b[..4].copy_from_slice(b"a\0  ");
        b[8..12].copy_from_slice(&(-3i32).to_be_bytes());
        assert_eq!(value_json(&ty, &b, None), json!({"n": -3, "s": "a\u{0}"}));
        let st = h5::describe_type(&s).unwrap();
        assert_eq!(st.numpy(0), json!("|S4"));
    }
}
