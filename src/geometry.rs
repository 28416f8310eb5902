//! Tile geometry: the tile grid of a dataset, tile names, and default tile shapes.

use crate::selection::Hyperslab;

/// A dataset shape cut into tiles of `tile` (edge tiles clipped).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TileGrid {
    pub shape: Vec<u64>,
    pub tile: Vec<u64>,
}

impl TileGrid {
    /// `tile` must have the rank of `shape` and no zero entry.
    pub fn new(shape: Vec<u64>, tile: Vec<u64>) -> Self {
        debug_assert_eq!(shape.len(), tile.len());
        TileGrid { shape, tile }
    }

    /// Number of tiles along each dimension.
    pub fn grid(&self) -> Vec<u64> {
        self.shape
            .iter()
            .zip(&self.tile)
            .map(|(&n, &t)| n.div_ceil(t.max(1)))
            .collect()
    }

    /// Saturating: a grid from a corrupt file may hold more tiles than u64 counts.
    pub fn num_tiles(&self) -> u64 {
        self.grid().iter().fold(1u64, |a, &g| a.saturating_mul(g))
    }

    /// The clipped hyperslab of tile `idx`, or None when `idx` is outside the grid.
    pub fn tile_slab(&self, idx: &[u64]) -> Option<Hyperslab> {
        if idx.len() != self.shape.len() {
            return None;
        }
        let grid = self.grid();
        let mut start = Vec::with_capacity(idx.len());
        let mut count = Vec::with_capacity(idx.len());
        for d in 0..idx.len() {
            if idx[d] >= grid[d] {
                return None;
            }
            let s = idx[d] * self.tile[d];
            start.push(s);
            count.push(self.tile[d].min(self.shape[d] - s));
        }
        Some(Hyperslab::block(&start, &count))
    }

    /// Tile indices in C order.
    pub fn indices(&self) -> impl Iterator<Item = Vec<u64>> + '_ {
        let grid = self.grid();
        let total = self.num_tiles();
        (0..total).map(move |lin| unravel(lin, &grid))
    }
}

/// Bytes of an array of `dims` elements of `elem` bytes, `None` when that overflows u64:
/// dims come from files and users, and a wrapped size would mis-size every buffer and
/// offset computed from it.
pub fn checked_bytes(dims: &[u64], elem: u64) -> Option<u64> {
    dims.iter().try_fold(elem, |a, &d| a.checked_mul(d))
}

/// C-order multi-index of linear index `lin` in `shape`.
pub fn unravel(mut lin: u64, shape: &[u64]) -> Vec<u64> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        let n = shape[d].max(1);
        idx[d] = lin % n;
        lin /= n;
    }
    idx
}

/// C-order linear index of `idx` in `shape`.
pub fn ravel(idx: &[u64], shape: &[u64]) -> u64 {
    idx.iter().zip(shape).fold(0, |acc, (&i, &n)| acc * n + i)
}

/// Visits the bytes `[off, end)` of the C-order bytes of a `shape` array of `elem`-byte
/// elements, cut into tiles of `tile`, as runs each inside one tile and one row of it:
/// `f(tile, at, from, len)` for the tile's C-order linear index in the grid, the
/// run's offset in the tile's own (clipped, C-order) bytes, and its offset in the
/// array. Arithmetic only: a 1 MiB write of a band of rows falls into thousands of
/// runs, and mapping it through extents and lookups cost more than the writes.
/// `end` must not pass the array's bytes (checked by the caller, as every size
/// product here then fits u64).
pub fn tile_runs(
    shape: &[u64],
    tile: &[u64],
    elem: u64,
    off: u64,
    end: u64,
    mut f: impl FnMut(u64, u64, u64, u64),
) {
    // a scalar is one row of one element in one tile
    let (shape, tile): (&[u64], &[u64]) = if shape.is_empty() {
        (&[1], &[1])
    } else {
        (shape, tile)
    };
    let n = shape.len() - 1;
    let (lead, last) = shape.split_at(n);
    let (tlead, tlast) = (&tile[..n], tile[n].max(1));
    let row = last[0] * elem;
    let grid: Vec<u64> = shape
        .iter()
        .zip(tile)
        .map(|(&s, &t)| s.div_ceil(t.max(1)))
        .collect();
    let tcol = tlast * elem;
    if row == 0 || tcol == 0 {
        return;
    }
    let mut p = off;
    let mut within = vec![0u64; n];
    let mut clipped = vec![0u64; n];
    while p < end {
        let (r, c0) = (p / row, p % row);
        let li = unravel(r, lead);
        // the tile row holding this row, and the row's place in its tiles
        let mut k_lead = 0;
        for d in 0..n {
            let t = tlead[d].max(1);
            let ti = li[d] / t;
            k_lead = k_lead * grid[d] + ti;
            within[d] = li[d] % t;
            clipped[d] = t.min(lead[d] - ti * t);
        }
        let row_in_tile = ravel(&within, &clipped);
        let row_end = (p - c0 + row).min(end);
        let mut c = c0;
        while p < row_end {
            let j = c / tcol;
            let width = tcol.min(row - j * tcol);
            let len = (row_end - p).min((j + 1) * tcol - c);
            let at = row_in_tile * width + (c - j * tcol);
            f(k_lead * grid[n] + j, at, p, len);
            p += len;
            c += len;
        }
    }
}

/// Tile file name: indices joined by '.'; a scalar's single tile is `0`.
pub fn tile_name(idx: &[u64]) -> String {
    if idx.is_empty() {
        return "0".to_string();
    }
    idx.iter().map(u64::to_string).collect::<Vec<_>>().join(".")
}

/// Parses a tile file name against a grid; only canonical names are accepted.
pub fn parse_tile_name(name: &str, grid: &[u64]) -> Option<Vec<u64>> {
    if grid.is_empty() {
        return (name == "0").then(Vec::new);
    }
    let parts: Vec<&str> = name.split('.').collect();
    if parts.len() != grid.len() {
        return None;
    }
    let mut idx = Vec::with_capacity(parts.len());
    for (p, &g) in parts.iter().zip(grid) {
        let canonical = !p.is_empty()
            && p.bytes().all(|b| b.is_ascii_digit())
            && (p.len() == 1 || !p.starts_with('0'));
        if !canonical {
            return None;
        }
        let v: u64 = p.parse().ok()?;
        if v >= g {
            return None;
        }
        idx.push(v);
    }
    Some(idx)
}

/// Row-block tile shape: whole trailing rows, about `target_bytes` per tile.
/// Each such tile is one contiguous run of the dataset's C-order bytes.
pub fn row_block_tile(shape: &[u64], elem_size: u64, target_bytes: u64) -> Vec<u64> {
    let rank = shape.len();
    let mut tile: Vec<u64> = shape.iter().map(|&n| n.max(1)).collect();
    // Find the outermost dimension d such that the block of trailing dims after d fits.
    let mut inner = elem_size.max(1); // bytes of one element of dims after d
    for d in (0..rank).rev() {
        let row = inner.saturating_mul(shape[d].max(1));
        if row > target_bytes || d == 0 {
            let r = (target_bytes / inner).clamp(1, shape[d].max(1));
            for t in tile.iter_mut().take(d) {
                *t = 1;
            }
            tile[d] = r;
            return tile;
        }
        inner = row;
    }
    tile
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Every byte of every window lands where the per-byte definition puts it.
    #[test]
    fn tile_runs_match_bytes() {
        let cases: &[(&[u64], &[u64], u64)] = &[
            (&[7, 5], &[3, 2], 4),
            (&[4, 6, 5], &[3, 4, 2], 2),
            (&[10], &[4], 8),
            (&[], &[], 4),
            (&[3, 1, 5], &[2, 1, 5], 1),
        ];
        for &(shape, tile, elem) in cases {
            let g = TileGrid::new(shape.to_vec(), tile.to_vec());
            let total = checked_bytes(shape, elem).unwrap();
            // byte b of the array -> (tile, offset in the tile's bytes)
            let want = |b: u64| {
                let e = unravel(b / elem, shape);
                let ti: Vec<u64> = e.iter().zip(tile).map(|(i, t)| i / t).collect();
                let slab = g.tile_slab(&ti).unwrap();
                let w: Vec<u64> = e.iter().zip(tile).map(|(i, t)| i % t).collect();
                let k = ravel(&ti, &g.grid());
                (k, ravel(&w, &slab.counts()) * elem + b % elem)
            };
            for off in 0..total {
                for end in off..=total {
                    let mut next = off;
                    tile_runs(shape, tile, elem, off, end, |k, at, from, len| {
                        assert_eq!(from, next, "{shape:?} {off}..{end}");
                        assert!(len > 0);
                        for b in 0..len {
                            assert_eq!((k, at + b), want(from + b), "{shape:?} byte {}", from + b);
                        }
                        next += len;
                    });
                    assert_eq!(next, end);
                }
            }
        }
    }

    #[test]
    fn grid_and_edges() {
        let g = TileGrid::new(vec![10, 7], vec![4, 4]);
        assert_eq!(g.grid(), vec![3, 2]);
        let s = g.tile_slab(&[2, 1]).unwrap();
        assert_eq!(s.counts(), vec![2, 3]);
        assert!(g.tile_slab(&[3, 0]).is_none());
        assert_eq!(g.indices().count(), 6);
        assert_eq!(TileGrid::new(vec![0, 5], vec![1, 5]).num_tiles(), 0);
    }

    #[test]
    fn sizes_and_counts_do_not_wrap() {
        assert_eq!(checked_bytes(&[4, 5], 8), Some(160));
        assert_eq!(checked_bytes(&[], 8), Some(8));
        // 2^32 * 2^32 elements: wrapped to 0 with a plain product in release builds.
        assert_eq!(checked_bytes(&[1 << 32, 1 << 32], 1), None);
        assert_eq!(checked_bytes(&[1 << 31, 1 << 31], 4), None);
        assert_eq!(checked_bytes(&[0, u64::MAX], 8), Some(0));
        let g = TileGrid::new(vec![u64::MAX, u64::MAX, 4], vec![1, 1, 1]);
        assert_eq!(g.num_tiles(), u64::MAX);
        let g = TileGrid::new(vec![1 << 32, 1 << 32], vec![1, 1]);
        assert_eq!(g.num_tiles(), u64::MAX);
        assert_eq!(g.indices().next(), Some(vec![0, 0]));
        assert_eq!(TileGrid::new(vec![0, u64::MAX], vec![1, 1]).num_tiles(), 0);
    }

    #[test]
    fn names() {
        assert_eq!(tile_name(&[1, 3]), "1.3");
        assert_eq!(tile_name(&[]), "0");
        assert_eq!(parse_tile_name("1.3", &[8, 8]), Some(vec![1, 3]));
        assert_eq!(parse_tile_name("01.3", &[8, 8]), None);
        assert_eq!(parse_tile_name("8.0", &[8, 8]), None);
        assert_eq!(parse_tile_name("1", &[8, 8]), None);
        assert_eq!(parse_tile_name("0", &[]), Some(vec![]));
        assert_eq!(parse_tile_name("1.", &[8, 8]), None);
    }

    #[test]
    fn row_blocks() {
        // 4096x4096 f4 = 16 KiB rows; 64 MiB -> 4096 rows (the whole thing).
        assert_eq!(row_block_tile(&[4096, 4096], 4, 64 << 20), vec![4096, 4096]);
        assert_eq!(row_block_tile(&[4096, 4096], 4, 1 << 20), vec![64, 4096]);
        // A single row larger than the target: split the next dimension.
        assert_eq!(row_block_tile(&[2, 1 << 20], 8, 1 << 20), vec![1, 131072]);
        assert_eq!(row_block_tile(&[3, 4, 5], 1, 7), vec![1, 1, 5]);
        assert_eq!(row_block_tile(&[], 4, 100), Vec::<u64>::new());
        assert_eq!(row_block_tile(&[0, 5], 4, 100), vec![1, 5]);
    }

    proptest! {
        #[test]
        fn tiles_partition_the_dataset(shape in proptest::collection::vec(1u64..9, 1..4),
                                       tsel in proptest::collection::vec(1u64..5, 4)) {
            let tile: Vec<u64> = shape.iter().zip(&tsel).map(|(_, &t)| t).collect();
            let g = TileGrid::new(shape.clone(), tile);
            let total: u64 = g.indices().map(|i| g.tile_slab(&i).unwrap().num_elements()).sum();
            prop_assert_eq!(total, shape.iter().product::<u64>());
            for i in g.indices() {
                prop_assert_eq!(parse_tile_name(&tile_name(&i), &g.grid()), Some(i));
            }
        }

        #[test]
        fn row_block_is_contiguous(shape in proptest::collection::vec(1u64..20, 1..5), es in 1u64..9,
                                   target in 1u64..4000) {
            let t = row_block_tile(&shape, es, target);
            // All dims after the first non-1 tile dim must be whole.
            let first = t.iter().position(|&x| x != 1).unwrap_or(t.len().saturating_sub(1));
            for d in first + 1..shape.len() {
                prop_assert_eq!(t[d], shape[d]);
            }
        }
    }
}
