//! One node per name inside a file, pending or committed, driven in process through
//! the filesystem core (no FUSE, real HDF5 files): the inodes the kernel holds and the
//! ones it gets at its next lookup when a name changes side.

mod common;

use common::{i32_bytes as bytes, opts};
use h5tilefs::fs::{Caller, Fs, ROOT_INO};
use std::path::Path;

/// `f.h5` with dataset `d`: 4 x 4 `<i4`, every element 7.
fn make_file(p: &Path) {
    common::make_i32_file(p, &["d"]);
}

fn read_all(fs: &Fs, ino: u64) -> Result<Vec<u8>, i32> {
    common::read_ino(fs, ino)
}

/// Declares `d` in file inode `file` (mkdir, meta.json) and writes `data` with `v`.
/// Returns the inodes of `d` and of its `data`.
fn declare_and_write(fs: &Fs, file: u64, v: i32) -> (u64, u64) {
    let d = fs.mkdir(file, "d", 0o755, 0, 0).unwrap().ino;
    let (_, fh) = fs.create(d, "meta.json").unwrap();
    fs.write(fh, 0, br#"{"shape": [4, 4], "dtype": "<i4"}"#)
        .unwrap();
    fs.flush(fh).unwrap();
    fs.release(fh);
    let data = fs.lookup(d, "data").unwrap().ino;
    let (fh, _, _) = fs.open(data, true, &Caller::DAEMON).unwrap();
    fs.write(fh, 0, &bytes(v)).unwrap();
    fs.release(fh);
    (d, data)
}

fn commit(fs: &Fs, file: u64) {
    let c = fs.lookup(file, ".commit").unwrap().ino;
    let (fh, _, _) = fs.open(c, true, &Caller::DAEMON).unwrap();
    fs.write(fh, 0, b"1").unwrap();
    fs.release(fh);
}

/// Core `b` holds the committed `d`'s inodes (the kernel keeps dentries 1 s); through
/// core `a` the dataset is removed and declared again, then written. The inodes `b`
/// holds answer as the pending dataset, for reads as well as writes (before, `data` and
/// `meta.json` read through them were ENOENT: the committed node was resolved against
/// the committed file only); `b`'s next lookups give new inodes.
#[test]
fn stale_committed_inodes_reach_the_dataset_declared_again() {
    let dir = tempfile::tempdir().unwrap();
    make_file(&dir.path().join("f.h5"));
    let a = Fs::new(dir.path(), opts()).unwrap();
    let b = Fs::new(dir.path(), opts()).unwrap();
    let fb = b.lookup(ROOT_INO, "f.h5").unwrap().ino;
    let db = b.lookup(fb, "d").unwrap().ino;
    let data_b = b.lookup(db, "data").unwrap().ino;
    let meta_b = b.lookup(db, "meta.json").unwrap().ino;
    let tiles_b = b.lookup(db, "tiles").unwrap().ino;
    let tile_name = b.readdir(tiles_b).unwrap()[0].name.clone();
    let tile_b = b.lookup(tiles_b, &tile_name).unwrap().ino;
    assert_eq!(read_all(&b, data_b), Ok(bytes(7)));

    let fa = a.lookup(ROOT_INO, "f.h5").unwrap().ino;
    a.rmdir(fa, "d").unwrap();
    declare_and_write(&a, fa, 9);

    let attr = b.getattr(data_b).unwrap();
    assert_eq!(attr.size, 64);
    assert!(attr.volatile, "pending data is answered with no caching");
    assert_eq!(
        read_all(&b, data_b),
        Ok(bytes(9)),
        "data through the held inode"
    );
    let meta = read_all(&b, meta_b).expect("meta.json through the held inode");
    assert!(String::from_utf8_lossy(&meta).contains("<i4"));
    assert_eq!(
        read_all(&b, tile_b),
        Ok(bytes(9)),
        "tile through the held inode"
    );
    let (fh, _, _) = b.open(tile_b, true, &Caller::DAEMON).unwrap();
    b.write(fh, 0, &bytes(5)).unwrap();
    b.release(fh);

    // A fresh walk through b: new inodes for the names that changed side.
    let db2 = b.lookup(fb, "d").unwrap().ino;
    assert_ne!(db2, db);
    let data_b2 = b.lookup(db2, "data").unwrap().ino;
    assert_ne!(data_b2, data_b);
    assert_eq!(read_all(&b, data_b2), Ok(bytes(5)));
}

/// A pending dataset that is committed gets new inodes at the next lookup of its names
/// (pending nodes carry no version, committed ones are bound to the file's), and the
/// committed file serves the bytes written.
#[test]
fn names_committed_from_pending_get_new_inodes() {
    let dir = tempfile::tempdir().unwrap();
    let fs = Fs::new(dir.path(), opts()).unwrap();
    let f = fs.mkdir(ROOT_INO, "f.h5", 0o755, 0, 0).unwrap().ino;
    let (d, data) = declare_and_write(&fs, f, 3);
    assert_eq!(
        fs.lookup(f, "d").unwrap().ino,
        d,
        "same pending node, same inode"
    );
    commit(&fs, f);
    let d2 = fs.lookup(f, "d").unwrap();
    assert_ne!(d2.ino, d);
    assert!(!d2.volatile);
    let data2 = fs.lookup(d2.ino, "data").unwrap().ino;
    assert_ne!(data2, data);
    assert_eq!(read_all(&fs, data2), Ok(bytes(3)));
    assert_eq!(
        fs.lookup(d2.ino, "data").unwrap().ino,
        data2,
        "stable while committed"
    );
}

/// rmdir gives the name a new inode at its next lookup, whichever side it was on and
/// whichever side it is made again on (the kernel marks the removed directory dead).
#[test]
fn rmdir_gives_the_name_a_new_inode() {
    let dir = tempfile::tempdir().unwrap();
    make_file(&dir.path().join("f.h5"));
    let fs = Fs::new(dir.path(), opts()).unwrap();
    let f = fs.lookup(ROOT_INO, "f.h5").unwrap().ino;
    let committed = fs.lookup(f, "d").unwrap().ino;
    let tiles = fs.lookup(committed, "tiles").unwrap().ino;
    fs.rmdir(committed, "tiles").unwrap();
    assert_ne!(fs.lookup(committed, "tiles").unwrap().ino, tiles);
    fs.rmdir(f, "d").unwrap();
    let (pending, _) = declare_and_write(&fs, f, 1);
    assert_ne!(pending, committed);
    fs.rmdir(f, "d").unwrap();
    let again = fs.mkdir(f, "d", 0o755, 0, 0).unwrap().ino;
    assert_ne!(again, pending);
    assert_eq!(fs.lookup(f, "d").unwrap().ino, again);
}

/// A listing is held from `opendir` to `releasedir` and paged from there; the first
/// read at offset 0 of a handle takes no second listing, a rewind does. A readdir
/// without `opendir` holds nothing.
#[test]
fn listings_are_held_per_open_directory_and_released() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..1100 {
        std::fs::create_dir(dir.path().join(format!("d{i:04}"))).unwrap();
    }
    let fs = Fs::new(dir.path(), opts()).unwrap();
    let fh = fs.opendir(ROOT_INO).unwrap();
    assert_eq!(fs.held_listings(), 1);
    // the 1 100 directories and the control file
    assert_eq!(fs.readdir_at(fh, ROOT_INO, 0).unwrap().len(), 1101);
    std::fs::create_dir(dir.path().join("late")).unwrap();
    // later pages come from the listing taken at opendir...
    assert_eq!(fs.readdir_at(fh, ROOT_INO, 50).unwrap().len(), 1101);
    // ...a rewind takes a new one
    assert_eq!(fs.readdir_at(fh, ROOT_INO, 0).unwrap().len(), 1102);
    fs.releasedir(fh);
    assert_eq!(fs.held_listings(), 0);
    assert_eq!(fs.readdir_at(0, ROOT_INO, 0).unwrap().len(), 1102);
    assert_eq!(fs.held_listings(), 0);
}
