//! Replays the fuzz targets' inputs on the stable toolchain, without libFuzzer: every
//! saved case under `fuzz/regressions/<target>/` (crashes the fuzzers found, kept after
//! the fix) and hand-made nasty inputs, through the targets' own code
//! (`fuzz/src/harness.rs`). Each must return, Ok or Err, without a panic: a panic is
//! either a crash in h5tilefs or a wrong answer caught by the harness's oracles.
//! See docs/fuzzing.md.

#[path = "../fuzz/src/harness.rs"]
mod harness;

use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Runs `f` on every input, each under `catch_unwind`, and fails listing all that panic.
fn replay(target: &str, f: fn(&[u8]), extra: Vec<(String, Vec<u8>)>) {
    let mut cases = extra;
    let dir = Path::new(ROOT).join("fuzz/regressions").join(target);
    if let Ok(rd) = std::fs::read_dir(&dir) {
        let mut files: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
        files.sort();
        for p in files {
            let b = std::fs::read(&p).unwrap();
            cases.push((p.display().to_string(), b));
        }
    }
    // An abort in C (libhdf5) cannot be caught: FUZZ_REPLAY_VERBOSE=1 names each case first.
    let verbose = std::env::var_os("FUZZ_REPLAY_VERBOSE").is_some();
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let failed: Vec<String> = cases
        .iter()
        .filter_map(|(name, b)| {
            if verbose {
                eprintln!("{target}: {name}");
            }
            std::panic::catch_unwind(|| f(b))
                .err()
                .map(|e| format!("{name}: {}", panic_text(&e)))
        })
        .collect();
    std::panic::set_hook(prev);
    assert!(
        failed.is_empty(),
        "{target}: {} of {} inputs panic:\n{}",
        failed.len(),
        cases.len(),
        failed.join("\n")
    );
}

fn panic_text(e: &Box<dyn std::any::Any + Send>) -> String {
    e.downcast_ref::<String>()
        .cloned()
        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

/// A `slice_name` input: rank, one byte per dim (0xF8 + 8 LE bytes for any value), name.
fn slice_input(shape: &[u64], name: &str) -> (String, Vec<u8>) {
    let mut b = vec![shape.len() as u8];
    for &n in shape {
        if n < 0xF8 {
            b.push(n as u8);
        } else {
            b.push(0xF8);
            b.extend(n.to_le_bytes());
        }
    }
    b.extend(name.as_bytes());
    (format!("slice {name:?} of {shape:?}"), b)
}

#[test]
fn slice_name() {
    const M: u64 = u64::MAX;
    let mut v = vec![];
    for name in [
        "0:18446744073709551615:1",
        "0:5:18446744073709551616",
        "::99999999999999999999",
        "-99999999999999999999:99999999999999999999:99999999999999999999",
        "18446744073709551615",
        "-18446744073709551616",
        "1:2:3:4",
        "٣",
        "1,",
        ",",
        "0.0",
        "00",
        "9.9",
        "18446744073709551616",
    ] {
        v.push(slice_input(&[10], name));
        v.push(slice_input(&[M], name));
        v.push(slice_input(&[10, 10], name));
    }
    for (shape, name) in [
        (vec![M, M], ":"),
        (vec![M, M, M], "::2,-1"),
        (vec![M], "-18446744073709551615:"),
        (vec![], "()"),
        (vec![], "0"),
        (vec![0], "0"),
        (vec![0, 0], ":,:"),
        (vec![1; 8], "0,0,0,0,0,0,0,0"),
    ] {
        v.push(slice_input(&shape, name));
    }
    v.push(slice_input(&[10], &",".repeat(100_000)));
    v.push(slice_input(&[10], &"9".repeat(100_000)));
    v.push(("empty".into(), vec![]));
    replay("slice_name", harness::slice_name, v);
}

#[test]
fn pending_meta() {
    let mut v: Vec<(String, Vec<u8>)> = [
        "",
        "{}",
        "null",
        "[]",
        r#"{"shape":[18446744073709551615],"dtype":"u1"}"#,
        r#"{"shape":[4294967296,4294967296],"dtype":"<f8"}"#,
        r#"{"shape":[2147483648,2147483648,0],"dtype":"u1","tile_shape":[1,1,1]}"#,
        r#"{"shape":[0,18446744073709551615,18446744073709551615],"dtype":"u1","tile_shape":[1,1,1]}"#,
        r#"{"shape":[10],"dtype":"u1","tile_shape":[18446744073709551615]}"#,
        r#"{"shape":[10],"dtype":"<f8","tile_shape":[0]}"#,
        r#"{"shape":[10],"dtype":"<c16","fill_value":[1e308,-1e308]}"#,
        r#"{"shape":[10],"dtype":"<f8","fill_value":1e400}"#,
        r#"{"shape":[10],"dtype":"<f8","fill_value":2.2250738585072011e-308}"#,
        r#"{"shape":[10],"dtype":"<f8","fill_value":5e-324}"#,
        r#"{"shape":[10],"dtype":"<f8","fill_value":-9223372036854775808}"#,
        r#"{"shape":[10],"dtype":"<f8","fill_value":18446744073709551615}"#,
        r#"{"shape":[10],"dtype":"<é8"}"#,
        r#"{"shape":[10],"dtype":"|f4"}"#,
        r#"{"shape":[10],"dtype":"<c99999999999999999999"}"#,
        r#"{"shape":[],"dtype":"bool","attrs":{"a":[1,{"b":null}]}}"#,
        r#"{"shape":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],"dtype":"u1"}"#,
        r#"{"shape":[-1],"dtype":"u1"}"#,
        r#"{"shape":[1.5],"dtype":"u1"}"#,
    ]
    .iter()
    .map(|s| (s.to_string(), s.as_bytes().to_vec()))
    .collect();
    for deep in ["[", "{\"a\":"] {
        let mut s = r#"{"shape":[1],"dtype":"u1","attrs":{"x":"#.to_string();
        s.push_str(&deep.repeat(100_000));
        v.push((format!("{deep} nested 100000 deep"), s.into_bytes()));
    }
    replay("pending_meta", harness::pending_meta, v);
}

/// An `ioctl` input: handle choice, command choice byte, argument bytes.
fn ioctl_input(which: u8, slice: Option<&str>, c: u8, offset: u64, len: u64) -> Vec<u8> {
    let mut b = vec![which];
    if let Some(s) = slice {
        b.push(s.len() as u8);
        b.extend(s.as_bytes());
    }
    b.push(c);
    b.extend([0u8; 8]); // version, nruns
    b.extend(offset.to_ne_bytes());
    b.extend(len.to_ne_bytes());
    b
}

#[test]
fn ioctl() {
    const M: u64 = u64::MAX;
    let mut v = vec![("empty".to_string(), vec![])];
    // 13 open handles (control; meta.json, data, tile per dataset), 4 slice dirs, bogus.
    for which in 0..18u8 {
        for c in 0..32u8 {
            for (off, len) in [(0, M), (M, M), (M - 1, 2), (3, 5), (0, 0)] {
                let slice = (13..17).contains(&which).then_some("1:7:2,::3");
                v.push((
                    format!("handle {which} cmd {c} [{off}, +{len})"),
                    ioctl_input(which, slice, c, off, len),
                ));
            }
        }
    }
    for which in 13..17u8 {
        for s in [
            "0:18446744073709551615:1",
            "-1",
            "::99999999999999999999",
            "()",
        ] {
            v.push((
                format!("slice {s:?} of dir {which}"),
                ioctl_input(which, Some(s), 3, 1, M),
            ));
        }
    }
    replay("ioctl", harness::ioctl, v);
}

/// Inputs on which the system libhdf5 1.10.8 (Debian) crashes inside the C library,
/// before or beneath any h5tilefs code: glibc's "buffer overflow detected" abort in
/// `H5S_select_deserialize` (a corrupt virtual-dataset layout, from `H5Dopen2`) and a
/// NULL `memcpy` in `H5D__contig_read` (from `H5Dread`). Nothing in h5tilefs can catch
/// these; HDF5 2.2 (the `static-hdf5` build, as in CI) gives errors, so there they are
/// replayed like every other input. Fuzz-found ones are in
/// `fuzz/regressions/h5_open_libhdf5/`; the hand-made ones are the byte flips of the
/// virtual-dataset seed (such as "vds_self.h5 byte 2224 inverted"), listed by prefix.
const LIBHDF5_110_ABORTS: &[&str] = &["vds_self.h5 byte "];

fn old_libhdf5() -> bool {
    hdf5::library_version() < (1, 14, 0)
}

#[test]
fn h5_open_libhdf5_crashers() {
    if old_libhdf5() {
        eprintln!(
            "skipped: libhdf5 {:?} aborts on these (see LIBHDF5_110_ABORTS)",
            hdf5::library_version()
        );
        return;
    }
    replay("h5_open_libhdf5", harness::h5_open, vec![]);
}

#[test]
fn h5_open() {
    let mut v = vec![
        ("empty".to_string(), vec![]),
        ("signature only".to_string(), b"\x89HDF\r\n\x1a\n".to_vec()),
    ];
    let mut sig_ff = b"\x89HDF\r\n\x1a\n".to_vec();
    sig_ff.extend([0xffu8; 200]);
    v.push(("signature + 0xff".into(), sig_ff));
    let seeds = Path::new(ROOT).join("fuzz/seeds/h5_open");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&seeds)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "seed files in {}", seeds.display());
    for p in files {
        let b = std::fs::read(&p).unwrap();
        let n = p.file_name().unwrap().to_string_lossy().to_string();
        v.push((n.clone(), b.clone()));
        // Truncated superblocks and files.
        for cut in [
            9,
            16,
            24,
            40,
            48,
            56,
            96,
            200,
            512,
            b.len() / 2,
            b.len() - 1,
        ] {
            v.push((format!("{n} cut at {cut}"), b[..cut.min(b.len())].to_vec()));
        }
        // Superblock fields: version, size of offsets / lengths, root address bytes.
        for (at, val) in [
            (8, 0xff),
            (13, 0),
            (13, 16),
            (14, 0xff),
            (16, 0xff),
            (40, 0xff),
        ] {
            let mut c = b.clone();
            c[at] = val;
            v.push((format!("{n} byte {at} = {val}"), c));
        }
        // Every 64th byte of the metadata region inverted, one at a time.
        for at in (48..b.len().min(4096)).step_by(64) {
            let mut c = b.clone();
            c[at] ^= 0xff;
            v.push((format!("{n} byte {at} inverted"), c));
        }
    }
    if old_libhdf5() {
        v.retain(|(n, _)| !LIBHDF5_110_ABORTS.iter().any(|p| n.starts_with(p)));
    }
    replay("h5_open", harness::h5_open, v);
}
