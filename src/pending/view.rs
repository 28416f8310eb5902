//! The view of a pending dataset (tiles written, not committed) as a dataset model:
//! each tile with a source file is a contiguous block of it, other tiles read as the
//! fill value. Built here, from pending state, so that the model knows nothing of it.

use super::tiles::TileTarget;
use crate::model::{DatasetModel, Storage, VBlock, VBlocks};
use crate::staging::{PendingMeta, RangeSet};
use std::sync::Arc;

/// The view of a pending dataset: each tile that has a source file is a contiguous
/// block of it; tiles not created yet read as the fill value.
pub fn view_model(
    name: &str,
    meta: &PendingMeta,
    tiles: &[(Vec<u64>, Option<Arc<TileTarget>>)],
) -> DatasetModel {
    view_model_written(name, meta, tiles, &Default::default())
}

/// [`view_model`], where the tiles in `written` (their written byte ranges) map only their
/// whole written elements to the source, the fill value elsewhere: for consumers of
/// the extent map (READ_TO_GPU, QUERY_EXTENTS), which cannot patch bytes after the
/// read. Bytes of an element written in part read as the fill value here.
pub fn view_model_written(
    name: &str,
    meta: &PendingMeta,
    tiles: &[(Vec<u64>, Option<Arc<TileTarget>>)],
    written: &std::collections::HashMap<Vec<u64>, RangeSet>,
) -> DatasetModel {
    let fill = crate::writer::fill_bytes(&meta.dtype, &meta.fill_value)
        .unwrap_or_else(|| vec![0; meta.itemsize as usize]);
    let grid = meta.grid();
    let mut blocks = Vec::with_capacity(tiles.len());
    for (idx, target) in tiles {
        let Some(slab) = grid.tile_slab(idx) else {
            continue;
        };
        let count = slab.counts();
        let source = target.as_ref().map(|t| {
            // an edge chunk of the chunked layout is whole: the tile is its corner
            let src_shape = t
                .source_shape()
                .map_or_else(|| count.clone(), <[u64]>::to_vec);
            let whole = Arc::new(DatasetModel::raw(
                name,
                src_shape.clone(),
                &meta.dtype,
                meta.itemsize,
                src_shape,
                fill.clone(),
                Storage::Contiguous {
                    file: t.file.clone(),
                    offset: t.offset,
                },
            ));
            let Some(rs) = written.get(idx) else {
                return whole;
            };
            let es = meta.itemsize.max(1);
            let n: u64 = count.iter().product();
            let mut blocks = Vec::new();
            for &(a, b) in rs.ranges() {
                let (ea, eb) = (a.div_ceil(es), (b / es).min(n));
                for (start, cnt) in crate::extent::linear_boxes(&count, ea, eb) {
                    blocks.push(VBlock {
                        vstart: start.clone(),
                        count: cnt,
                        source: Some(whole.clone()),
                        sstart: start,
                        lazy: None,
                    });
                }
            }
            Arc::new(DatasetModel::raw(
                name,
                count.clone(),
                &meta.dtype,
                meta.itemsize,
                count.clone(),
                fill.clone(),
                Storage::Virtual(VBlocks::new(blocks)),
            ))
        });
        blocks.push(VBlock {
            vstart: slab.dims.iter().map(|d| d.start).collect(),
            sstart: vec![0; count.len()],
            count,
            source,
            lazy: None,
        });
    }
    let storage = if meta.shape.is_empty() {
        match tiles.first().and_then(|t| t.1.as_ref()) {
            Some(t) => Storage::Contiguous {
                file: t.file.clone(),
                offset: t.offset,
            },
            None => Storage::Fill,
        }
    } else {
        Storage::Virtual(VBlocks::new(blocks))
    };
    DatasetModel::raw(
        name,
        meta.shape.clone(),
        &meta.dtype,
        meta.itemsize,
        meta.tile_shape.clone(),
        fill,
        storage,
    )
}
