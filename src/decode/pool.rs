//! Worker threads for decoding and background reads; a panicking job is logged and
//! does not take its worker down.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub type Job = Box<dyn FnOnce() + Send>;

/// Worker threads fed from one queue, started on first use; `queued` bounds prefetch
/// work. The decode pool is one; the view read-ahead has its own
/// (`readahead::view_background`).
pub struct WorkerPool {
    name: &'static str,
    tx: std::sync::OnceLock<Mutex<std::sync::mpsc::Sender<Job>>>,
    queued: Arc<AtomicU64>,
    threads: usize,
}

impl WorkerPool {
    /// A pool of `threads` threads named `h5t-NAME-i`.
    pub fn new(name: &'static str, threads: usize) -> Self {
        WorkerPool {
            name,
            tx: std::sync::OnceLock::new(),
            queued: Arc::new(AtomicU64::new(0)),
            threads,
        }
    }

    /// Queues `job`; gives it back when no worker could be started (the caller runs it).
    pub fn submit(&self, job: Job) -> std::result::Result<(), Job> {
        let tx = self.tx.get_or_init(|| {
            let (tx, rx) = std::sync::mpsc::channel::<Job>();
            let rx = Arc::new(Mutex::new(rx));
            let self_name = self.name;
            for i in 0..self.threads {
                let rx = rx.clone();
                let queued = self.queued.clone();
                let spawned = std::thread::Builder::new()
                    .name(format!("h5t-{}-{i}", self.name))
                    .spawn(move || loop {
                        let job = rx.lock().recv();
                        match job {
                            Ok(job) => {
                                queued.fetch_sub(1, Ordering::Relaxed);
                                run_job(self_name, job)
                            }
                            Err(_) => return,
                        }
                    });
                if let Err(e) = spawned {
                    tracing::warn!(pool = self.name, error = %e, "worker thread not started");
                }
            }
            Mutex::new(tx)
        });
        self.queued.fetch_add(1, Ordering::Relaxed);
        let sent = tx.lock().send(job);
        sent.map_err(|e| {
            self.queued.fetch_sub(1, Ordering::Relaxed);
            e.0
        })
    }
}

/// Where the cell cache (`cache.rs`) runs its background decodes: the decode pool
/// in the daemon, a thread per job under the concurrency checker.
pub trait Executor: Send + Sync {
    /// Queues `job`; gives it back when it could not be queued (the caller runs it).
    fn submit(&self, job: Job) -> Result<(), Job>;
    /// Jobs queued and not yet started.
    fn queued(&self) -> u64;
    /// Threads running the jobs.
    fn threads(&self) -> usize;
}

impl Executor for WorkerPool {
    fn submit(&self, job: Job) -> Result<(), Job> {
        WorkerPool::submit(self, job)
    }
    fn queued(&self) -> u64 {
        self.queued.load(Ordering::Relaxed)
    }
    fn threads(&self) -> usize {
        self.threads
    }
}

/// Runs one pool job; a panic is logged and stops there, so the worker thread lives
/// on (a job that fails a cell publishes its error itself: [`CellCache::fill`]).
fn run_job(pool: &'static str, job: Job) {
    if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)) {
        tracing::error!(
            pool,
            panic = %panic_message(payload.as_ref()),
            "a pool job panicked; the worker goes on"
        );
    }
}

pub use crate::error::panic_message;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panicking_pool_job_does_not_kill_its_worker() {
        let pool = WorkerPool::new("test", 1);
        let (tx, rx) = std::sync::mpsc::channel();
        for i in 0..3 {
            let tx = tx.clone();
            let job: Job = Box::new(move || {
                if i < 2 {
                    panic!("job {i} panics");
                }
                let _ = tx.send(i);
            });
            assert!(pool.submit(job).is_ok());
        }
        assert_eq!(
            rx.recv_timeout(std::time::Duration::from_secs(10)),
            Ok(2),
            "the only worker ran the job after two panicking ones"
        );
    }
}
