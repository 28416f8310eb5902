//! Helpers shared by the Rust integration tests (`mod common;`): the core's options
//! without a GPU, small HDF5 sample files, errno results and whole reads through a core.
//! Each test target compiles this file on its own and uses part of it.
#![allow(dead_code)]

pub mod mount;

use h5tilefs::fs::{Caller, Fs, FsOptions};
use std::path::Path;

/// The options every in-process core runs with: no GPU, defaults otherwise.
pub fn opts() -> FsOptions {
    FsOptions {
        gpu: h5tilefs::gpu::GpuMode::Off,
        ..FsOptions::default()
    }
}

/// A core over `root` with [`opts`] (several of them stand for daemons on several nodes).
pub fn core(root: &Path) -> Fs {
    Fs::new(root, opts()).expect("Fs::new")
}

/// An HDF5 file at `p` holding one dataset per name: 4 x 4 `<i4`, every element 7.
pub fn make_i32_file<S: AsRef<str>>(p: &Path, names: &[S]) {
    let f = hdf5::File::create(p).expect("create h5");
    for n in names {
        f.new_dataset::<i32>()
            .shape([4, 4])
            .create(n.as_ref())
            .expect("create dataset")
            .write_raw(&[7i32; 16])
            .expect("write dataset");
    }
}

/// The bytes of a 4 x 4 `<i4` dataset whose every element is `v`.
pub fn i32_bytes(v: i32) -> Vec<u8> {
    (0..16).flat_map(|_| v.to_le_bytes()).collect()
}

/// A core's result with its error reduced to the errno the adapter would answer.
pub fn errno<T>(r: h5tilefs::error::Result<T>) -> Result<T, i32> {
    r.map_err(|e| e.errno)
}

/// Reads an open handle from offset 0 to its end, 64 KiB a call (as the kernel does).
pub fn read_fh(fs: &Fs, fh: u64) -> Result<Vec<u8>, i32> {
    let mut out = Vec::new();
    loop {
        let b = errno(fs.read(fh, out.len() as u64, 1 << 16))?;
        if b.is_empty() {
            return Ok(out);
        }
        out.extend(b);
    }
}

/// Opens inode `ino` for reading, reads all of it and releases it.
pub fn read_ino(fs: &Fs, ino: u64) -> Result<Vec<u8>, i32> {
    let (fh, _, _) = errno(fs.open(ino, false, &Caller::DAEMON))?;
    let r = read_fh(fs, fh);
    fs.release(fh);
    r
}

/// The errno's text, for messages.
pub fn ename(e: i32) -> String {
    std::io::Error::from_raw_os_error(e).to_string()
}
