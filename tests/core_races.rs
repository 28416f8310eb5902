//! Races between several filesystem cores (standing for daemons on several nodes) over
//! one backing directory, driven in process: no FUSE, real HDF5 files.

mod common;

use common::opts;
use h5tilefs::fs::{Fs, ROOT_INO};
use std::path::Path;

fn make_file(p: &Path, names: &[String]) {
    common::make_i32_file(p, names);
}

fn datasets(p: &Path) -> Vec<String> {
    let f = hdf5::File::open(p).unwrap();
    let mut v = f.member_names().unwrap();
    v.sort();
    v
}

/// Datasets of one committed file removed at the same moment through two cores, two
/// removals each: every removal that returned success must be gone from the file and
/// none may fail. Before removals took the file's lock and started from the file as it
/// was then, one removal's rewrite overwrote another's (or both wrote one temporary).
#[test]
fn concurrent_removals_through_two_cores_all_land() {
    let rounds = 12;
    for round in 0..rounds {
        let dir = tempfile::tempdir().unwrap();
        let names: Vec<String> = (0..5).map(|i| format!("d{i}")).collect();
        make_file(&dir.path().join("f.h5"), &names);
        let a = Fs::new(dir.path(), opts()).unwrap();
        let b = Fs::new(dir.path(), opts()).unwrap();
        let cores = [&a, &b];
        let results: Vec<(String, Result<(), i32>)> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|i| {
                    let fs = cores[i % 2];
                    let name = names[i].clone();
                    s.spawn(move || {
                        let file = fs.lookup(ROOT_INO, "f.h5").map_err(|e| e.errno)?;
                        let r = fs.rmdir(file.ino, &name).map_err(|e| e.errno);
                        Ok::<_, i32>((name, r))
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap().unwrap()).collect()
        });
        for (name, r) in &results {
            assert_eq!(*r, Ok(()), "round {round}: rmdir {name} failed: {r:?}");
        }
        assert_eq!(
            datasets(&dir.path().join("f.h5")),
            vec!["d4".to_string()],
            "round {round}: a removal was lost"
        );
        // no temporary left behind in the staging area
        let stage = dir.path().join(".h5tilefs").join("f.h5");
        if let Ok(rd) = std::fs::read_dir(&stage) {
            for e in rd.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                assert!(!n.contains("tmp"), "round {round}: left {n}");
            }
        }
    }
}

/// A removal of a dataset another core already removed is ENOENT, not EIO.
#[test]
fn removing_a_removed_dataset_is_enoent() {
    let dir = tempfile::tempdir().unwrap();
    make_file(&dir.path().join("f.h5"), &["x".into(), "y".into()]);
    let a = Fs::new(dir.path(), opts()).unwrap();
    let b = Fs::new(dir.path(), opts()).unwrap();
    let fa = a.lookup(ROOT_INO, "f.h5").unwrap();
    let fb = b.lookup(ROOT_INO, "f.h5").unwrap();
    // b learns of x before a removes it
    b.lookup(fb.ino, "x").unwrap();
    a.rmdir(fa.ino, "x").unwrap();
    let e = b.rmdir(fb.ino, "x").unwrap_err();
    assert_eq!(e.errno, libc::ENOENT, "{e}");
    assert_eq!(datasets(&dir.path().join("f.h5")), vec!["y".to_string()]);
}
