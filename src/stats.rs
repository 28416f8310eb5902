//! Per-operation counters and latency histograms, lock-free so that every FUSE thread
//! can record without contention. Served as JSON in `/.h5tilefs` (`stats.ops`).

use serde_json::{json, Map, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The operations we time (one per FUSE request kind that does work).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Lookup,
    Getattr,
    Setattr,
    Open,
    Read,
    Write,
    Flush,
    Release,
    Opendir,
    Readdir,
    Mkdir,
    Create,
    Unlink,
    Rmdir,
    Ioctl,
    Statfs,
    Fsync,
    Rename,
}

impl Op {
    pub const ALL: [Op; 18] = [
        Op::Lookup,
        Op::Getattr,
        Op::Setattr,
        Op::Open,
        Op::Read,
        Op::Write,
        Op::Flush,
        Op::Release,
        Op::Opendir,
        Op::Readdir,
        Op::Mkdir,
        Op::Create,
        Op::Unlink,
        Op::Rmdir,
        Op::Ioctl,
        Op::Statfs,
        Op::Fsync,
        Op::Rename,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Op::Lookup => "lookup",
            Op::Getattr => "getattr",
            Op::Setattr => "setattr",
            Op::Open => "open",
            Op::Read => "read",
            Op::Write => "write",
            Op::Flush => "flush",
            Op::Release => "release",
            Op::Opendir => "opendir",
            Op::Readdir => "readdir",
            Op::Mkdir => "mkdir",
            Op::Create => "create",
            Op::Unlink => "unlink",
            Op::Rmdir => "rmdir",
            Op::Ioctl => "ioctl",
            Op::Statfs => "statfs",
            Op::Fsync => "fsync",
            Op::Rename => "rename",
        }
    }
}

/// Latency buckets: bucket `i` holds latencies below `2^i` µs (and at least `2^(i-1)`);
/// the last one everything slower (about 33 s and up).
pub const BUCKETS: usize = 26;

#[derive(Default)]
struct OpStats {
    count: AtomicU64,
    errors: AtomicU64,
    bytes: AtomicU64,
    max_us: AtomicU64,
    total_us: AtomicU64,
    hist: [AtomicU64; BUCKETS],
}

/// Counters for every [`Op`], and the requests in flight (so a request stuck in a
/// library call shows up in `status`).
pub struct Stats {
    ops: Vec<OpStats>,
    inflight: dashmap::DashMap<u64, (Op, std::time::Instant)>,
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            ops: Op::ALL.iter().map(|_| OpStats::default()).collect(),
            inflight: dashmap::DashMap::new(),
        }
    }
}

fn bucket(us: u64) -> usize {
    // 0 and 1 µs land in bucket 0 and 1; then one bucket per power of two.
    ((64 - us.leading_zeros()) as usize).min(BUCKETS - 1)
}

/// Upper bound (µs) of a bucket, for quantiles; `None` for the open last bucket.
fn upper_us(b: usize) -> Option<u64> {
    (b < BUCKETS - 1).then(|| 1u64 << b)
}

impl Stats {
    fn slot(&self, op: Op) -> &OpStats {
        // Op::ALL lists every variant in declaration order, so the index is in range.
        &self.ops[op as usize]
    }

    /// Records one finished request.
    pub fn record(&self, op: Op, took: Duration, ok: bool, bytes: u64) {
        let s = self.slot(op);
        let us = took.as_micros().min(u64::MAX as u128) as u64;
        s.count.fetch_add(1, Ordering::Relaxed);
        if !ok {
            s.errors.fetch_add(1, Ordering::Relaxed);
        }
        s.bytes.fetch_add(bytes, Ordering::Relaxed);
        s.total_us.fetch_add(us, Ordering::Relaxed);
        s.max_us.fetch_max(us, Ordering::Relaxed);
        s.hist[bucket(us)].fetch_add(1, Ordering::Relaxed);
    }

    /// A request started (`req` is the kernel's unique id).
    pub fn begin(&self, req: u64, op: Op) {
        self.inflight.insert(req, (op, std::time::Instant::now()));
    }

    /// A request finished (answered or failed).
    pub fn end(&self, req: u64) {
        self.inflight.remove(&req);
    }

    /// `{count, oldest_ms, oldest_op}` of the requests being served now.
    pub fn inflight_json(&self) -> Value {
        let oldest = self
            .inflight
            .iter()
            .map(|e| (e.value().1.elapsed(), e.value().0))
            .max_by_key(|(d, _)| *d);
        json!({
            "count": self.inflight.len(),
            "oldest_ms": oldest.map(|(d, _)| d.as_millis() as u64).unwrap_or(0),
            "oldest_op": oldest.map(|(_, o)| o.name()),
        })
    }

    pub fn count(&self, op: Op) -> u64 {
        self.slot(op).count.load(Ordering::Relaxed)
    }

    /// `{op: {count, errors, bytes, mean_us, p50_us, p90_us, p99_us, max_us, hist}}` for
    /// every op seen; `hist` maps a bucket's upper bound ("<=N us", or "slower") to counts.
    pub fn to_json(&self) -> Value {
        let mut out = Map::new();
        for op in Op::ALL {
            let s = self.slot(op);
            let count = s.count.load(Ordering::Relaxed);
            if count == 0 {
                continue;
            }
            let hist: Vec<u64> = s.hist.iter().map(|h| h.load(Ordering::Relaxed)).collect();
            let total: u64 = hist.iter().sum();
            let max_us = s.max_us.load(Ordering::Relaxed);
            let q = |p: f64| -> u64 {
                let want = ((total as f64) * p).ceil().max(1.0) as u64;
                let mut seen = 0;
                for (b, n) in hist.iter().enumerate() {
                    seen += n;
                    if seen >= want {
                        return upper_us(b).unwrap_or(max_us).min(max_us.max(1));
                    }
                }
                max_us
            };
            let mut h = Map::new();
            for (b, n) in hist.iter().enumerate() {
                if *n > 0 {
                    let key = match upper_us(b) {
                        Some(u) => format!("<{u}us"),
                        None => "slower".to_string(),
                    };
                    h.insert(key, json!(n));
                }
            }
            out.insert(
                op.name().to_string(),
                json!({
                    "count": count,
                    "errors": s.errors.load(Ordering::Relaxed),
                    "bytes": s.bytes.load(Ordering::Relaxed),
                    "mean_us": s.total_us.load(Ordering::Relaxed) / count.max(1),
                    "p50_us": q(0.50),
                    "p90_us": q(0.90),
                    "p99_us": q(0.99),
                    "max_us": max_us,
                    "hist": h,
                }),
            );
        }
        Value::Object(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_index_in_declaration_order() {
        for (i, op) in Op::ALL.iter().enumerate() {
            assert_eq!(*op as usize, i);
        }
    }

    #[test]
    fn inflight_requests() {
        let s = Stats::default();
        s.begin(7, Op::Open);
        std::thread::sleep(Duration::from_millis(5));
        s.begin(8, Op::Read);
        let v = s.inflight_json();
        assert_eq!(v["count"], 2);
        assert_eq!(v["oldest_op"], "open");
        assert!(v["oldest_ms"].as_u64().unwrap() >= 5);
        s.end(7);
        s.end(8);
        assert_eq!(s.inflight_json()["count"], 0);
    }

    #[test]
    fn buckets_and_quantiles() {
        let s = Stats::default();
        for us in [0u64, 1, 3, 100, 100, 100, 100, 100, 100, 5_000] {
            s.record(Op::Read, Duration::from_micros(us), true, 10);
        }
        s.record(Op::Read, Duration::from_secs(100), false, 0);
        let v = s.to_json();
        let r = &v["read"];
        assert_eq!(r["count"], 11);
        assert_eq!(r["errors"], 1);
        assert_eq!(r["bytes"], 100);
        // 100 µs lies in [64, 128): the median's bucket bound is 128.
        assert_eq!(r["p50_us"], 128);
        assert_eq!(r["max_us"], 100_000_000);
        assert_eq!(r["hist"]["slower"], 1);
        assert_eq!(r["hist"]["<128us"], 6);
        assert!(v.get("write").is_none());
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(1), 1);
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
    }
}
