//! Drops values on a background thread. Closing the last descriptor of a deleted
//! multi-GiB file frees its blocks, which costs the file system tens of milliseconds per
//! GiB; a request that merely noticed that a backing file was replaced should not pay
//! for releasing the old one.

use std::sync::mpsc::{channel, Sender};
use std::sync::OnceLock;

type Item = Box<dyn Send>;

static QUEUE: OnceLock<Option<Sender<Item>>> = OnceLock::new();

fn queue() -> Option<&'static Sender<Item>> {
    QUEUE
        .get_or_init(|| {
            let (tx, rx) = channel::<Item>();
            std::thread::Builder::new()
                .name("h5tilefs-reaper".into())
                .spawn(move || {
                    for item in rx {
                        drop(item);
                    }
                })
                .ok()
                .map(|_| tx)
        })
        .as_ref()
}

/// Drops `v` on the reaper thread (or here, if that thread could not be started).
pub fn drop_later<T: Send + 'static>(v: T) {
    if let Some(tx) = queue() {
        // A failed send hands the value back inside the error, dropped here.
        let _ = tx.send(Box::new(v));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::sync_channel;
    use std::time::Duration;

    struct Tell(std::sync::mpsc::SyncSender<std::thread::ThreadId>);
    impl Drop for Tell {
        fn drop(&mut self) {
            let _ = self.0.send(std::thread::current().id());
        }
    }

    #[test]
    fn values_are_dropped_on_another_thread() {
        let (tx, rx) = sync_channel(1);
        drop_later(Tell(tx));
        let on = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("value was never dropped");
        assert_ne!(on, std::thread::current().id());
    }
}
