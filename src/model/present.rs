//! Presentations of a dataset: meta.json, and what the Zarr view needs.

use super::dataset::{DatasetModel, Storage};
use crate::h5::{self, DType, Layout};
use serde_json::{json, Value};
use std::sync::Arc;

impl DatasetModel {
    /// meta.json bytes, built once.
    pub fn meta_json(&self) -> Arc<Vec<u8>> {
        self.meta
            .get_or_init(|| {
                let mut v = serde_json::to_vec(&self.meta_value()).unwrap_or_default();
                v.push(b'\n');
                Arc::new(v)
            })
            .clone()
    }

    /// What the Zarr view (src/zarr.rs) needs of this dataset.
    pub fn zarr_info(&self) -> crate::zarr::ArrayInfo<'_> {
        let dtype = match &self.dtype {
            _ if !self.supported() => Err("the dataset is not served (see `unsupported`)".into()),
            DType::Numeric { ty, descr, .. } => Ok(ty
                .as_ref()
                .and_then(|t| t.numpy(self.itemsize()).as_str().map(str::to_string))
                .unwrap_or_else(|| descr.clone())),
            DType::Unsupported { reason, .. } => Err(reason.clone()),
        };
        let (vlen_str, text_chars) = match &self.dtype {
            DType::Numeric { ty: Some(t), .. } => match **t {
                h5::Ty::VStr { chars, .. } => (true, chars),
                _ => (false, None),
            },
            _ => (false, None),
        };
        crate::zarr::ArrayInfo {
            name: &self.name,
            shape: &self.zarr_shape,
            tile_shape: &self.tile_shape,
            itemsize: self.itemsize(),
            dtype,
            attrs: &self.attrs,
            fill: self.fill_json(),
            fill_bytes: &self.fill,
            vlen_str,
            text_chars,
        }
    }

    /// The size of one element in the Zarr view's chunk files (4 bytes a character for
    /// strings shown as unicode).
    pub fn zarr_itemsize(&self) -> u64 {
        self.zarr_info().zarr_itemsize()
    }

    /// Characters per element of strings the Zarr view shows as unicode.
    pub fn zarr_text_chars(&self) -> Option<u64> {
        self.zarr_info().text_chars()
    }

    /// Why the Zarr view leaves this dataset out, or None when it shows it.
    pub fn zarr_why_not(&self) -> Option<String> {
        crate::zarr::why_not(&self.zarr_info())
    }

    /// The dataset's zarr.json, or None when the Zarr view leaves it out
    /// ([`Self::zarr_why_not`], which meta.json's `zarr` says).
    pub fn zarr_json(&self) -> Option<Arc<Vec<u8>>> {
        self.zarr
            .get_or_init(|| crate::zarr::array_json(&self.zarr_info()).map(Arc::new))
            .clone()
    }

    pub fn meta_value(&self) -> Value {
        let mut m = serde_json::Map::new();
        m.insert("name".into(), json!(self.name));
        m.insert("shape".into(), json!(self.shape));
        match &self.dtype {
            DType::Numeric {
                descr,
                itemsize,
                ty,
            } => {
                match ty {
                    Some(ty) => {
                        m.insert("dtype".into(), ty.numpy(*itemsize));
                        type_meta(ty, &mut m);
                    }
                    None => {
                        m.insert("dtype".into(), json!(descr));
                    }
                }
                m.insert("itemsize".into(), json!(itemsize));
            }
            DType::Unsupported { itemsize, .. } => {
                m.insert("dtype".into(), Value::Null);
                m.insert("itemsize".into(), json!(itemsize));
            }
        }
        m.insert("layout".into(), json!(self.layout.name()));
        m.insert("chunks".into(), json!(self.chunks));
        m.insert("filters".into(), json!(self.filters));
        m.insert("order".into(), json!("C"));
        m.insert(
            "zarr".into(),
            match self.zarr_why_not() {
                None => json!({"served": true}),
                Some(why) => json!({"served": false, "why": why}),
            },
        );
        if self.supported() {
            let g = self.grid();
            m.insert("tile_shape".into(), json!(self.tile_shape));
            m.insert("tile_grid".into(), json!(g.grid()));
            m.insert("nbytes".into(), json!(self.nbytes()));
            m.insert("fill_value".into(), self.fill_json());
            if let Some(limit) = self.decode_limit() {
                m.insert("decode_limit".into(), limit);
            }
        } else if let DType::Unsupported { reason, .. } = &self.dtype {
            m.insert("unsupported".into(), json!(reason));
        }
        m.insert(
            "maxshape".into(),
            json!(self.maxshape.iter().collect::<Vec<_>>()),
        );
        if self.layout == Layout::Virtual {
            m.insert(
                "virtual_sources".into(),
                json!({
                    "mappings": self.virtual_count,
                    "missing": self.missing_sources,
                    "served_by": match self.storage {
                        Storage::Virtual(_) => "extent-map",
                        _ => "hdf5",
                    },
                }),
            );
        }
        m.insert("attrs".into(), Value::Object(self.attrs.clone()));
        Value::Object(m)
    }

    /// For a filtered dataset whose chunks decode to more than the daemon decodes one
    /// chunk to (`MAX_CELL_BYTES`, 1 GiB): the limit, the chunk's size and what it
    /// means (a stored chunk reads as EFBIG, where h5py reads it).
    fn decode_limit(&self) -> Option<Value> {
        let chunks = self.chunks.as_ref()?;
        if self.filters.is_empty() {
            return None;
        }
        let bytes = crate::geometry::checked_bytes(chunks, self.itemsize()).unwrap_or(u64::MAX);
        if bytes <= h5::MAX_CELL_BYTES {
            return None;
        }
        Some(json!({
            "chunk_bytes": bytes,
            "max_chunk_bytes": h5::MAX_CELL_BYTES,
            "note": format!(
                "a chunk decodes to {bytes} bytes, more than the {} bytes h5tilefs decodes \
                 one chunk to: reading a stored chunk fails (EFBIG) where h5py reads it, \
                 unwritten chunks read as the fill value; rewrite it with smaller chunks \
                 (`h5repack -l {}:CHUNK=...`)",
                h5::MAX_CELL_BYTES,
                self.name
            ),
        }))
    }

    /// The fill value as JSON, decoded from its stored bytes.
    pub fn fill_json(&self) -> Value {
        match &self.dtype {
            DType::Numeric { ty: Some(ty), .. } if self.fill_defined => {
                crate::attrs::value_json(ty, &self.fill, None)
            }
            DType::Numeric { ty: Some(_), .. } => Value::Null,
            DType::Numeric { descr, .. } => crate::attrs::scalar_json(descr, &self.fill),
            DType::Unsupported { .. } => Value::Null,
        }
    }
}

/// What meta.json says about a type beyond its numpy dtype: an enum's members, a
/// string's stored padding and charset (and whether it was variable-length); for a
/// compound, the same per member under `fields` (an array member says it of its base).
fn type_meta(ty: &h5::Ty, m: &mut serde_json::Map<String, Value>) {
    match ty {
        h5::Ty::Array { base, .. } => type_meta(base, m),
        h5::Ty::Compound { fields, .. } => {
            let mut per = serde_json::Map::new();
            for (name, _, fty) in fields {
                let mut sub = serde_json::Map::new();
                type_meta(fty, &mut sub);
                if !sub.is_empty() {
                    per.insert(name.clone(), Value::Object(sub));
                }
            }
            if !per.is_empty() {
                m.insert("fields".into(), Value::Object(per));
            }
        }
        h5::Ty::Enum { members, .. } => {
            let map: serde_json::Map<String, Value> =
                members.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
            m.insert("enum".into(), Value::Object(map));
        }
        h5::Ty::Str { pad, utf8, .. } => {
            m.insert(
                "string".into(),
                json!({
                    "padding": pad.name(),
                    "charset": if *utf8 { "utf-8" } else { "ascii" },
                    "variable_length": false,
                    "served": if ty.converts() { "nullpad (converted like h5py)" } else { "as stored" },
                }),
            );
        }
        h5::Ty::VStr { utf8, .. } => {
            m.insert(
                "string".into(),
                json!({
                    "padding": "nullpad",
                    "charset": if *utf8 { "utf-8" } else { "ascii" },
                    "variable_length": true,
                    "served": "fixed width, NUL padded to the longest string",
                }),
            );
        }
        _ => {}
    }
}
