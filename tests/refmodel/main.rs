//! Reference-model test of the filesystem core (in the spirit of mountpoint-s3's
//! reftests). Several `Fs` cores stand for daemons on different nodes over one backing
//! directory; proptest drives random sequences of operations, each through a randomly
//! chosen core, and every answer (bytes, listings, errno) is compared with a plain
//! in-memory model of docs/namespace.md: file -> dataset -> C-order bytes, pending vs
//! committed. No FUSE and no kernel: the core's own API, as the adapter calls it.
//!
//! Run: `cargo test --release --features static-hdf5 --test refmodel -- --nocapture`.
//! `REFMODEL_CASES=N` changes the number of sequences (default below).
//!
//! `replay_through_a_mount` runs a few seeded programs through a live FUSE mount of the
//! binary as well (real system calls); `REFMODEL_REPLAY_SEED=N` replays program N there.
//!
//! Layout: `generators` (the programs), `reference` (what they should answer),
//! `harness` (running them and comparing), `drivers` (in-process cores or a mount), `scenarios` (fixed programs).

#[path = "../common/mod.rs"]
mod common;
mod drivers;
mod generators;
mod harness;
mod reference;
mod scenarios;

use common::mount::Mount;
use generators::op_strategy;
use generators::Op;
use harness::{run, run_on, Sut, OK_OPS};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The default seed of the random sequences.
const REFMODEL_SEED: u64 = 20261123;

fn cases() -> u32 {
    std::env::var("REFMODEL_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300)
}

#[test]
fn reference_model() {
    let n = cases();
    let ran = AtomicUsize::new(0);
    let ops_run = AtomicUsize::new(0);
    // A fixed seed by default, so `make test` runs the same sequences every time (a
    // red CI must mean a change broke something); REFMODEL_SEED=random (or a number)
    // explores others.
    let seed = match std::env::var("REFMODEL_SEED").ok().as_deref() {
        Some("random") => proptest::test_runner::RngSeed::Random,
        Some(v) => proptest::test_runner::RngSeed::Fixed(v.parse().unwrap_or(REFMODEL_SEED)),
        None => proptest::test_runner::RngSeed::Fixed(REFMODEL_SEED),
    };
    eprintln!("refmodel: seed {seed:?}");
    let mut runner = TestRunner::new(Config {
        cases: n,
        failure_persistence: None,
        max_shrink_iters: 2000,
        rng_seed: seed,
        ..Config::default()
    });
    let t0 = std::time::Instant::now();
    let r = runner.run(&prop::collection::vec(op_strategy(), 1..60), |ops| {
        ran.fetch_add(1, Ordering::Relaxed);
        ops_run.fetch_add(ops.len(), Ordering::Relaxed);
        run(&ops).map_err(TestCaseError::fail)
    });
    eprintln!(
        "refmodel: {} sequences ({} ops, shrinking included) in {:.1} s; succeeded: {:?}",
        ran.load(Ordering::Relaxed),
        ops_run.load(Ordering::Relaxed),
        t0.elapsed().as_secs_f64(),
        OK_OPS.lock().map(|m| m.clone()).unwrap_or_default()
    );
    if let Err(e) = r {
        panic!("{e}");
    }
}

/// The program of seed `seed`: `len` operations drawn from [`op_strategy`].
fn program(seed: u64, len: usize) -> Vec<Op> {
    let mut runner = TestRunner::new(Config {
        rng_seed: proptest::test_runner::RngSeed::Fixed(seed),
        ..Config::default()
    });
    prop::collection::vec(op_strategy(), len..=len)
        .new_tree(&mut runner)
        .expect("a program")
        .current()
}

/// Seeded programs replayed through a live mount of the binary (`h5tilefs mount` over a
/// fresh backing directory, unmounted at the end): every answer of a real system call
/// (bytes, listings, errno, QUERY_EXTENTS through the ioctl) must match the reference,
/// as the same program through in-process cores must. Skipped, with the reason, where
/// /dev/fuse or the binary is missing. `REFMODEL_REPLAY_SEED=N` replays program N only;
/// `REFMODEL_REPLAY_OPS` sets the program length.
#[test]
fn replay_through_a_mount() {
    if let Some(why) = common::mount::unusable() {
        eprintln!("replay_through_a_mount: skipped: {why}");
        return;
    }
    let env_num = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
    let seeds: Vec<u64> = match env_num("REFMODEL_REPLAY_SEED") {
        Some(s) => vec![s],
        None => (1..=REPLAY_SEEDS).collect(),
    };
    let len = env_num("REFMODEL_REPLAY_OPS").unwrap_or(REPLAY_OPS as u64) as usize;
    let t0 = std::time::Instant::now();
    let mut mounted: std::collections::BTreeMap<&str, usize> = Default::default();
    for seed in seeds {
        let ops = program(seed, len);
        run(&ops).unwrap_or_else(|e| panic!("seed {seed} through cores: {e}"));
        let m = Mount::start(&[]).unwrap_or_else(|e| panic!("mount: {e}"));
        let log = m.log.clone();
        let r = run_on(Sut::mounted(m), &ops);
        for (k, n) in r.iter().flatten() {
            *mounted.entry(*k).or_default() += n;
        }
        if let Err(e) = r {
            let tail = std::fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = tail.lines().rev().take(20).collect();
            panic!(
                "seed {seed} through a mount: {e}\nreplay: REFMODEL_REPLAY_SEED={seed} cargo test \
                 --release --features static-hdf5 --test refmodel replay_through_a_mount\n\
                 program: {ops:?}\ndaemon log (last lines, newest first):\n{}",
                tail.join("\n")
            );
        }
    }
    eprintln!(
        "replay_through_a_mount: {len} operations a program in {:.1} s; succeeded through the mount: {mounted:?}",
        t0.elapsed().as_secs_f64()
    );
}

/// Programs that diverge through a mount only (seeds of [`program`], 60 operations):
/// an old handle on a committed dataset's `data`, tile or slice, opened before the
/// dataset (or its file) is removed, replaced or declared again, reads ENOENT or other
/// bytes through the kernel, where through the core it keeps the bytes it showed when
/// opened (docs/namespace.md). Ignored until that is fixed; `--ignored` runs them.
#[test]
#[ignore = "known: old handles through a mount lose their bytes (seeds 16, 30, 37)"]
fn replay_old_handles_through_a_mount() {
    if let Some(why) = common::mount::unusable() {
        eprintln!("replay_old_handles_through_a_mount: skipped: {why}");
        return;
    }
    let mut failed = Vec::new();
    for seed in [16, 30, 37] {
        let ops = program(seed, REPLAY_OPS);
        run(&ops).unwrap_or_else(|e| panic!("seed {seed} through cores: {e}"));
        let m = Mount::start(&[]).unwrap_or_else(|e| panic!("mount: {e}"));
        if let Err(e) = run_on(Sut::mounted(m), &ops) {
            failed.push(format!("seed {seed}: {e}"));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// Programs `replay_through_a_mount` runs by default, and their length.
const REPLAY_SEEDS: u64 = 12;
const REPLAY_OPS: usize = 60;
