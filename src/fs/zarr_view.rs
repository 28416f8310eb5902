//! The Zarr view of a pending dataset's directory (docs/namespace.md "Zarr writes"):
//! `zarr.json`, `c`, its levels and chunks, and the temporary files a Zarr writer makes
//! (`<key>.<x>.partial`) until it renames them onto their keys.

use super::attr::Kind;
use super::mount::Mount;
use super::node::{dataset_child, Node, NodeKind, ObjRef};
use crate::codecs::encode::zarr_codec;
use crate::error::{Error, NamespaceError, Result};
use crate::names::{parse_index, DatasetEntry, Pending};
use crate::staging::PendingMeta;
use crate::zarr::{chunk_bytes, ArrayInfo};

/// What a temporary file stands for, once renamed.
pub enum Temp {
    Meta,
    Chunk(Vec<u64>),
}

/// The Zarr view of a pending dataset (its declaration standing for the model).
fn info<'a>(path: &'a str, pm: &'a PendingMeta) -> ArrayInfo<'a> {
    ArrayInfo {
        name: path,
        shape: &pm.shape,
        tile_shape: &pm.tile_shape,
        itemsize: pm.itemsize,
        dtype: Ok(pm.dtype.clone()),
        attrs: &pm.attrs,
        fill: pm.fill_value.clone(),
        fill_bytes: &[],
        vlen_str: false,
        text_chars: None,
    }
}

/// A pending dataset's zarr.json, or None when Zarr has no data type for it.
/// A zstd, gzip or blosc dataset's chunks are shown (and taken) encoded with that codec.
pub fn zarr_json(path: &str, pm: &PendingMeta) -> Option<Vec<u8>> {
    let b = crate::zarr::array_json(&info(path, pm))?;
    let codec = pm
        .compression
        .as_ref()
        .and_then(|c| zarr_codec(c, pm.itemsize as usize));
    if codec.is_none() && pm.dims.is_none() {
        return Some(b);
    }
    let mut v: serde_json::Value = serde_json::from_slice(&b).ok()?;
    if let Some(codec) = codec {
        v.get_mut("codecs")?.as_array_mut()?.push(codec);
    }
    if let (Some(d), Some(o)) = (&pm.dims, v.as_object_mut()) {
        o.insert("dimension_names".into(), serde_json::json!(d));
    }
    let mut b = serde_json::to_vec_pretty(&v).ok()?;
    b.push(b'\n');
    Some(b)
}

/// The chunk index `name` stands for in `c/prefix` (the final component), if any.
pub fn chunk_index(pm: &PendingMeta, prefix: &[u64], name: &str) -> Option<Vec<u64>> {
    let grid = pm.grid().grid();
    let i = parse_index(name, *grid.get(prefix.len())?)?;
    let mut idx = prefix.to_vec();
    idx.push(i);
    (idx.len() == grid.len()).then_some(idx)
}

/// What the temporary file `name` in `prefix` (None: the dataset's own directory)
/// becomes when renamed: `<final>.<anything>`.
pub fn temp_kind(pm: Option<&PendingMeta>, prefix: Option<&[u64]>, name: &str) -> Option<Temp> {
    let (stem, rest) = name.split_once('.')?;
    if rest.is_empty() {
        return None;
    }
    match (prefix, pm) {
        (None, _) if stem == DatasetEntry::ZarrJson.stem() => Some(Temp::Meta),
        (None, Some(pm)) if stem == DatasetEntry::ZarrChunks.stem() && pm.shape.is_empty() => {
            Some(Temp::Chunk(vec![]))
        }
        (Some(p), Some(pm)) => chunk_index(pm, p, stem).map(Temp::Chunk),
        _ => None,
    }
}

pub fn temp_of(node: &Node, pm: Option<&PendingMeta>) -> Option<Temp> {
    match node {
        Node::In(_, NodeKind::ZarrTemp { prefix, name }) => temp_kind(pm, prefix.as_deref(), name),
        _ => None,
    }
}

/// Whether `child_of` leaves `name` under `parent` (a pending dataset's directory
/// or a level of its `c/`) to [`child`].
pub fn is_name(cx: &Mount, parent: &Node, meta: Option<&PendingMeta>, name: &str) -> bool {
    let (file, path, prefix) = match parent {
        Node::In(ObjRef { file, path }, NodeKind::Object) => (file, path, None),
        Node::In(_, NodeKind::ZarrDir { .. }) => return true,
        _ => return false,
    };
    let temp = Node::at(
        file.clone(),
        path.clone(),
        NodeKind::ZarrTemp {
            prefix,
            name: name.to_string(),
        },
    );
    if cx.zarr_temps.contains_key(&temp) {
        return true;
    }
    DatasetEntry::parse(name).is_some_and(|e| e.rule().pending == Pending::ZarrView)
        && meta.is_some_and(|pm| zarr_json(path, pm).is_some())
}

/// A name of the Zarr view of a pending dataset: `zarr.json`, `c`, its levels and
/// chunks, and the temporary files being written.
pub fn child(cx: &Mount, parent: &Node, meta: Option<&PendingMeta>, name: &str) -> Result<Node> {
    let (file, path, prefix) = match parent {
        Node::In(ObjRef { file, path }, NodeKind::Object) => (file, path, None),
        Node::In(ObjRef { file, path }, NodeKind::ZarrDir { prefix }) => {
            (file, path, Some(prefix.clone()))
        }
        _ => return Err(NamespaceError::NotADirectory(format!("{parent:?}")).into()),
    };
    let temp = Node::at(
        file.clone(),
        path.clone(),
        NodeKind::ZarrTemp {
            prefix: prefix.clone(),
            name: name.to_string(),
        },
    );
    if cx.zarr_temps.contains_key(&temp) {
        return Ok(temp);
    }
    let pm = meta.ok_or_else(|| Error::not_found(format!("{path} is not declared yet")))?;
    let (file, path) = (file.clone(), path.clone());
    match (prefix, DatasetEntry::parse(name)) {
        (None, Some(e @ (DatasetEntry::ZarrJson | DatasetEntry::ZarrChunks))) => {
            Ok(dataset_child(e, &file, &path, pm.shape.is_empty()).0)
        }
        (Some(p), _) => {
            let grid = pm.grid().grid();
            let i = grid
                .get(p.len())
                .and_then(|&g| parse_index(name, g))
                .ok_or_else(|| {
                    Error::not_found(format!("{path}: no Zarr chunk key part {name:?}"))
                })?;
            let mut idx = p;
            idx.push(i);
            Ok(if idx.len() == grid.len() {
                Node::In(ObjRef { file, path }, NodeKind::ZarrChunk { idx })
            } else {
                Node::In(ObjRef { file, path }, NodeKind::ZarrDir { prefix: idx })
            })
        }
        _ => Err(Error::not_found(format!("no {name} in {path}"))),
    }
}

/// Kind and size of a Zarr node of a pending dataset. A node the kernel holds keeps
/// working after a rename (its dentry then names the final key), so temporary files
/// need not be registered here, only to be looked up.
pub fn attr(node: &Node, meta: Option<&PendingMeta>) -> Result<(Kind, u64)> {
    let path = node.file_and_path().map(|(_, p)| p).unwrap_or("/");
    let declared = || Error::not_found(format!("{path} is not declared yet"));
    let json_len = |pm: Option<&PendingMeta>| {
        pm.and_then(|pm| zarr_json(path, pm))
            .map_or(0, |j| j.len() as u64)
    };
    let chunk = |pm: &PendingMeta| chunk_bytes(&pm.tile_shape, pm.itemsize);
    Ok(match node {
        Node::In(_, NodeKind::Zarr) => (Kind::File, json_len(meta)),
        Node::In(_, NodeKind::ZarrDir { .. }) => {
            meta.ok_or_else(declared)?;
            (Kind::Dir, 0)
        }
        Node::In(_, NodeKind::ZarrChunk { .. }) => (Kind::File, chunk(meta.ok_or_else(declared)?)),
        Node::In(_, NodeKind::ZarrTemp { .. }) => match temp_of(node, meta) {
            Some(Temp::Meta) => (Kind::File, json_len(meta)),
            Some(Temp::Chunk(_)) => (Kind::File, chunk(meta.ok_or_else(declared)?)),
            None => return Err(declared()),
        },
        _ => return Err(Error::not_found(format!("{path} is not a Zarr node"))),
    })
}

/// A Zarr group's `zarr.json` in a pending file (docs/namespace.md "Zarr writes"): the
/// attributes stored when a group zarr.json was written there (the root, or a group
/// made by mkdir); None when none was.
pub fn group_json(cx: &Mount, file: &std::path::Path, path: &str) -> Option<Vec<u8>> {
    let attrs = cx.pending.group_attrs(file, path)?;
    let v = serde_json::json!({"zarr_format": 3, "node_type": "group", "attributes": attrs});
    let mut b = serde_json::to_vec_pretty(&v).ok()?;
    b.push(b'\n');
    Some(b)
}

/// Whether `r`, resolved for `file`, is a group of a pending file that a Zarr group's
/// zarr.json may be written in: a pending group (made by mkdir), or the root or a
/// committed group of a file that is pending.
pub fn is_pending_group(cx: &Mount, file: &std::path::Path, r: &super::node::Resolved) -> bool {
    use super::node::Resolved;
    match r {
        Resolved::Pending { meta: None } => true,
        Resolved::Group { .. } => cx.pending.is_pending(file),
        _ => false,
    }
}

/// `name` in the group at `path` of a pending file, when it is a Zarr writer's:
/// `zarr.json` once a group zarr.json was written, or a temporary file being written.
pub fn group_child(cx: &Mount, file: &std::path::Path, path: &str, name: &str) -> Option<Node> {
    let temp = Node::at(
        file.to_path_buf(),
        path.to_string(),
        NodeKind::ZarrTemp {
            prefix: None,
            name: name.to_string(),
        },
    );
    if cx.zarr_temps.contains_key(&temp) {
        return Some(temp);
    }
    (name == DatasetEntry::ZarrJson.name() && cx.pending.group_attrs(file, path).is_some())
        .then(|| Node::at(file.to_path_buf(), path.to_string(), NodeKind::Zarr))
}
