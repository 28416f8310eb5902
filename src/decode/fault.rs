//! A test hook for the panic safety of the decode path: with
//! `H5TILEFS_FAULT_PANIC_CELL=N` set when the daemon starts, decoding chunk `N` of any
//! filtered dataset panics (docs/operations.md). Off unless set.

use std::sync::atomic::{AtomicU64, Ordering};

/// The chunk index whose decode panics; `u64::MAX`: none.
static PANIC_CELL: AtomicU64 = AtomicU64::new(u64::MAX);

/// Reads `H5TILEFS_FAULT_PANIC_CELL` once, at daemon start.
pub fn arm_from_env() {
    let Ok(v) = std::env::var("H5TILEFS_FAULT_PANIC_CELL") else {
        return;
    };
    match v.trim().parse::<u64>() {
        Ok(n) if n != u64::MAX => {
            PANIC_CELL.store(n, Ordering::Relaxed);
            tracing::warn!(
                chunk = n,
                "test fault hook armed: decoding this chunk of any filtered dataset panics"
            );
        }
        _ => {
            tracing::warn!(value = %v, "H5TILEFS_FAULT_PANIC_CELL is not a chunk index; ignored")
        }
    }
}

/// Panics when the hook names chunk `index`.
pub fn check(index: u64) {
    if PANIC_CELL.load(Ordering::Relaxed) == index {
        panic!("test fault hook: H5TILEFS_FAULT_PANIC_CELL={index}");
    }
}
