//! Where a pending tile's bytes go in its source file: one run, or one run per row of
//! an edge tile that the chunked layout stores inside its whole chunk.

use crate::error::Result;
use crate::extent::BackingFile;
use crate::geometry::{ravel, unravel};
use std::sync::Arc;

/// Writes a tile's bytes itself: given the target and the file runs
/// `(file offset, offset into the bytes, length)` they go to ([`TileTarget::runs`]).
pub type PutRuns<'a> = dyn FnMut(&TileTarget, &[(u64, u64, u64)]) -> Result<()> + 'a;

/// Tiles and their targets (None: no source yet), as a view of a pending dataset
/// holds them.
pub type TileTargets = Vec<(Vec<u64>, Option<Arc<TileTarget>>)>;

/// Where a tile's bytes go: its source file and the offset of its data.
pub struct TileTarget {
    pub file: Arc<BackingFile>,
    pub offset: u64,
    pub size: u64,
    /// A chunk of the chunked layout whose tile is clipped in a dimension after the
    /// first: the tile's rows lie apart in the (whole) chunk.
    pub padded: Option<Padded>,
}

/// An edge tile inside a whole chunk: HDF5 stores edge chunks whole, so the tile's
/// C-order rows (of `count` elements) lie at the chunk's row pitch (of `chunk`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Padded {
    pub count: Vec<u64>,
    pub chunk: Vec<u64>,
    pub itemsize: u64,
}

impl Padded {
    fn rows(&self) -> (&[u64], &[u64], u64, u64) {
        let r = self.count.len().saturating_sub(1);
        let row = self.count.get(r).copied().unwrap_or(1) * self.itemsize;
        let pitch = self.chunk.get(r).copied().unwrap_or(1) * self.itemsize;
        (&self.count[..r], &self.chunk[..r], row, pitch)
    }
}

impl TileTarget {
    /// Whether the source was deleted outside h5tilefs while open (link count 0). Asks the
    /// kernel for the link count alone: a full fstat of a file being written makes a
    /// GlusterFS client flush its write-behind first (2.6 ms a call, once per write
    /// request, measured), where a link count the kernel holds (fresh within the file
    /// system's attribute timeout; an unlink through the same kernel updates it at once)
    /// needs no round trip.
    pub fn source_deleted(&self) -> bool {
        use std::os::fd::AsRawFd;
        // SAFETY: statx reads the fd we hold open (borrowed for the call) and writes the
        // zeroed struct we own; the empty path with AT_EMPTY_PATH names that fd.
        let (r, st) = unsafe {
            let mut st: libc::statx = std::mem::zeroed();
            let r = libc::statx(
                self.file.file.as_raw_fd(),
                c"".as_ptr(),
                libc::AT_EMPTY_PATH | libc::AT_STATX_SYNC_AS_STAT,
                libc::STATX_NLINK,
                &mut st,
            );
            (r, st)
        };
        if r == 0 && st.stx_mask & libc::STATX_NLINK != 0 {
            return st.stx_nlink == 0;
        }
        // (statx refused, e.g. by a sandbox's filter, or no link count: a full fstat)
        use std::os::unix::fs::MetadataExt;
        self.file.file.metadata().is_ok_and(|m| m.nlink() == 0)
    }

    /// The file ranges `(file offset, offset into the bytes, length)` that tile bytes
    /// `[off, off + len)` lie in: one range, or one per row of a padded edge tile.
    pub fn runs(&self, off: u64, len: u64) -> Vec<(u64, u64, u64)> {
        let Some(p) = &self.padded else {
            return vec![(self.offset + off, 0, len)];
        };
        let (outer, chunk_outer, row, pitch) = p.rows();
        let mut out = Vec::new();
        let (mut b, end) = (off, off + len);
        while b < end && row > 0 {
            let (r, within) = (b / row, b % row);
            let n = (row - within).min(end - b);
            let at = ravel(&unravel(r, outer), chunk_outer) * pitch + within;
            out.push((self.offset + at, b - off, n));
            b += n;
        }
        out
    }

    /// The tile byte at file offset `at` (the inverse of [`TileTarget::runs`]); None
    /// outside the tile's bytes (before it, or in an edge chunk's padding).
    pub fn tile_offset(&self, at: u64) -> Option<u64> {
        let rel = at.checked_sub(self.offset)?;
        let Some(p) = &self.padded else {
            return (rel < self.size).then_some(rel);
        };
        let (outer, chunk_outer, row, pitch) = p.rows();
        let (cr, within) = (rel / pitch.max(1), rel % pitch.max(1));
        let i = unravel(cr, chunk_outer);
        if within >= row
            || i.iter().zip(outer).any(|(a, b)| a >= b)
            || cr >= chunk_outer.iter().product()
        {
            return None;
        }
        Some(ravel(&i, outer) * row + within)
    }

    /// The end of the file range the tile's bytes lie in (its whole chunk when padded).
    pub fn file_end(&self) -> u64 {
        match &self.padded {
            Some(p) => self.offset + p.chunk.iter().product::<u64>() * p.itemsize,
            None => self.offset + self.size,
        }
    }

    /// The shape of the array the tile's bytes sit in: the whole chunk of a padded
    /// edge tile, else None (the tile's own).
    pub fn source_shape(&self) -> Option<&[u64]> {
        self.padded.as_ref().map(|p| p.chunk.as_slice())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An edge tile of the chunked layout sits in the corner of its whole chunk: every
    /// tile byte goes to the chunk position of its element, and the inverse maps back
    /// (padding maps to no tile byte).
    #[test]
    fn padded_tiles_map_rows_into_their_chunk() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let file = Arc::new(BackingFile {
            path: p.clone(),
            file: std::fs::File::create(&p).unwrap(),
        });
        let (count, chunk, es) = (vec![2u64, 3, 2], vec![4u64, 4, 3], 2u64);
        let t = TileTarget {
            file,
            offset: 1000,
            size: 2 * 3 * 2 * es,
            padded: Some(Padded {
                count: count.clone(),
                chunk: chunk.clone(),
                itemsize: es,
            }),
        };
        // byte b of the tile: element (i, j, k), byte within it
        let want = |b: u64| {
            let (e, w) = (b / es, b % es);
            let (i, j, k) = (e / 6, e / 2 % 3, e % 2);
            1000 + ((i * 4 + j) * 3 + k) * es + w
        };
        for off in 0..t.size {
            for len in 1..=(t.size - off) {
                let runs = t.runs(off, len);
                let mut covered = 0;
                for (at, from, n) in runs {
                    assert_eq!(from, covered);
                    for x in 0..n {
                        assert_eq!(at + x, want(off + from + x));
                        assert_eq!(t.tile_offset(at + x), Some(off + from + x));
                    }
                    covered += n;
                }
                assert_eq!(covered, len);
            }
        }
        // padding: element (0, 0, 2) and row (0, 3, *)
        assert_eq!(t.tile_offset(1000 + 2 * es), None);
        assert_eq!(t.tile_offset(1000 + 9 * es), None);
        assert_eq!(t.tile_offset(999), None);
    }
}
