//! The compressed chunked layout's regions (docs/namespace.md, "Compressed chunked
//! datasets"): the span of the file being built that the declaration reserves for the
//! writers' encodings, and the regions each daemon claims from it.

use crate::error::{Error, Result};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// Most bytes a daemon reserves at once for its encodings of one dataset: the unused
/// end of its last region stays a hole in the middle of the committed file (it takes
/// no disk space, only apparent size).
pub(super) const REGION_MAX: u64 = 64 << 20;

/// The bytes a daemon reserves at once for its encodings of a dataset of `chunks`
/// chunks of `cb` bytes: a 32nd of the data (the span regions are claimed from holds
/// the data, a quarter more and 8 regions: the unused ends of 8 daemons' last regions
/// fit even where nothing compresses), at least [`REGION_MIN`] and a chunk, at most
/// [`REGION_MAX`] unless a chunk is larger, in whole blocks.
pub(super) fn region_bytes(chunks: u64, cb: u64) -> u64 {
    let align = crate::ondisk::ALIGN;
    // (each chunk from a block of its own; a region of tiny chunks is still 1 MiB:
    // a region claimed per chunk made 1 100 claims for 1 100 chunks of 8 bytes)
    let acb = cb.saturating_add(align - 1) / align * align;
    (chunks.saturating_mul(acb) / 32)
        .clamp(REGION_MIN, REGION_MAX)
        .max(acb)
        .saturating_add(align - 1)
        / align
        * align
}

/// Where the regions of dataset generation `gen` of node directory `node` are claimed.
pub(super) fn dir(node: &Path, gen: &str) -> std::path::PathBuf {
    node.join(format!("regions.{gen}"))
}

/// Makes the regions directory, durably (at the declaration, under the file's lock).
pub(super) fn make_dir(d: &Path) -> Result<()> {
    crate::durable::create_dir_all(d)?;
    crate::durable::fsync_dir(d.parent().unwrap_or(Path::new(".")))
}

/// Every region claimed in `dir`, `(at, len)`: the commit frees what they hold that no
/// chunk uses, a daemon's that died before it recorded anything included. An entry
/// without its newline (its claimer died writing it) holds nothing.
pub(super) fn claimed(dir: &Path) -> Vec<(u64, u64)> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.parse::<u64>().is_ok())
        })
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .filter(|t| t.ends_with('\n'))
        .filter_map(|t| {
            let mut it = t.split_whitespace().map(|x| x.parse::<u64>());
            match (it.next(), it.next()) {
                (Some(Ok(at)), Some(Ok(len))) => Some((at, len)),
                _ => None,
            }
        })
        .collect()
}

/// Least bytes a daemon reserves at once for its encodings of one dataset.
const REGION_MIN: u64 = 1 << 20;

/// Claims `len` bytes for a writer's region from the span `[lo, hi)` reserved at the
/// declaration: regions are numbered entries `dir/<n>` holding `at len\n` (decimal),
/// created with O_EXCL on their own name (the server decides) and never changed, each
/// starting where the one before ends, so only the last one is read (from `hint`, the
/// number of entries this daemon has seen: a claim reads only what is new). Called
/// under the file's lock (the `Reserve` transition); an entry another node created
/// that this node's client does not show yet makes the creation fail, and the entries
/// are read again. Not a link of a finished temporary (`durable::create_exclusive`):
/// on GlusterFS `link` onto an existing name succeeded, so two nodes each claimed
/// region 0 and wrote their chunks over each other's (the two-node suite, every run).
/// An entry without its final newline is one whose claimer died writing it: it never
/// used the region, which counts as empty. Fails when the span is used up (the commit
/// then encodes the rest).
pub(super) fn claim_region(
    dir: &Path,
    lo: u64,
    hi: u64,
    len: u64,
    hint: &AtomicU64,
) -> Result<u64> {
    // (made at the declaration: a dataset declared by an earlier version has none,
    // and its encodings are the commit's)
    if !dir.is_dir() {
        return Err(Error::io(format!(
            "{}: no regions directory",
            dir.display()
        )));
    }
    let align = crate::ondisk::ALIGN;
    let read = |n: u64| -> Result<Option<u64>> {
        let p = dir.join(n.to_string());
        match std::fs::read_to_string(&p) {
            // (a claimer that died before its newline never used the region)
            Ok(t) if !t.ends_with('\n') => Ok(Some(0)),
            Ok(t) => {
                let mut it = t.split_whitespace().map(|x| x.parse::<u64>());
                match (it.next(), it.next()) {
                    (Some(Ok(at)), Some(Ok(l))) => Ok(Some(at.saturating_add(l))),
                    _ => Err(Error::io(format!("{}: not a region entry", p.display()))),
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::from_io(format!("reading {}", p.display()), e)),
        }
    };
    for _ in 0..64 {
        let mut n = hint.load(Ordering::Relaxed);
        let mut next = match n.checked_sub(1) {
            Some(last) => read(last)?.unwrap_or(lo),
            None => lo,
        };
        while let Some(end) = read(n)? {
            next = next.max(end);
            n += 1;
        }
        hint.store(n, Ordering::Relaxed);
        let at = next
            .max(lo)
            .checked_next_multiple_of(align)
            .filter(|a| a.checked_add(len).is_some_and(|e| e <= hi))
            .ok_or_else(|| Error::io(format!("{}: the writers' span is used up", dir.display())))?;
        let entry = format!("{at} {len}\n");
        if create_entry(&dir.join(n.to_string()), entry.as_bytes())? {
            tracing::debug!(dir = %dir.display(), entry = n, at, len, "region claimed");
            hint.store(n + 1, Ordering::Relaxed);
            return Ok(at);
        }
    }
    Err(Error::io(format!(
        "{}: no region entry could be made",
        dir.display()
    )))
}

/// Creates `path` with O_EXCL and writes `data` durably; false if it exists.
fn create_entry(path: &Path, data: &[u8]) -> Result<bool> {
    use std::io::Write;
    let mut f = match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(false),
        Err(e) => return Err(Error::from_io(format!("creating {}", path.display()), e)),
    };
    f.write_all(data)
        .and_then(|()| f.sync_all())
        .map_err(|e| Error::from_io(format!("writing {}", path.display()), e))?;
    crate::durable::fsync_dir(path.parent().unwrap_or(Path::new(".")))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regions claimed from the span one after another, never overlapping, until the
    /// span is used up; entries of another node found by the creation's failure.
    #[test]
    fn regions_are_claimed_one_after_another_within_the_span() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("regions.g");
        let h = AtomicU64::new(0);
        assert!(
            claim_region(&d, 8192, 8192 + 40_000, 10_000, &h).is_err(),
            "no directory"
        );
        make_dir(&d).unwrap();
        let a = claim_region(&d, 8192, 8192 + 40_000, 10_000, &h).unwrap();
        assert_eq!(a, 8192);
        let b = claim_region(&d, 8192, 8192 + 40_000, 5_000, &h).unwrap();
        assert_eq!(b, 8192 + 12_288, "after the first, block aligned");
        // another node's entry, written directly
        std::fs::write(d.join("2"), format!("{} 100\n", b + 8192)).unwrap();
        let c = claim_region(&d, 8192, 8192 + 40_000, 4_096, &AtomicU64::new(0)).unwrap();
        assert_eq!(c, b + 12_288);
        assert!(
            claim_region(&d, 8192, 8192 + 40_000, 20_000, &h).is_err(),
            "span used up"
        );
        // a claimer that died writing entry 4 (no newline): it used nothing
        std::fs::write(d.join("4"), "90000 4").unwrap();
        let e = claim_region(&d, 8192, 8192 + 40_000, 1, &AtomicU64::new(0)).unwrap();
        assert_eq!(e, c + 4096);
        assert!(d.join("5").is_file());
        std::fs::write(d.join("6"), "garbage\n").unwrap();
        assert!(claim_region(&d, 8192, 8192 + 40_000, 1, &AtomicU64::new(0)).is_err());
        // the commit's view: every whole entry, the unfinished one as nothing
        let mut all = claimed(&d);
        all.sort();
        assert_eq!(
            all,
            vec![(a, 10_000), (b, 5_000), (b + 8192, 100), (c, 4_096), (e, 1)]
        );
    }
}
