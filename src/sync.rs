//! The synchronization primitives of the daemon's shared tables, as a [`Family`] the
//! tables are generic over: the real ones ([`Real`]: parking_lot, std atomics) in the
//! daemon, shuttle's ([`Shuttle`], tests only) in the concurrency tests. Why: a
//! concurrency checker schedules threads only at the primitives it provides, so a table
//! built on a lock it cannot see (DashMap's) gives it nothing to explore. The same table
//! code runs in both; only the lock and the counter differ. See "Concurrency tests
//! (shuttle)" in docs/reliability.md.

use hashbrown::hash_table::{self, HashTable};
use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};

/// The primitives a table is built on.
pub trait Family: Sized + 'static {
    type RwLock<T>: RwLock<T>;
    type Mutex<T: Send>: Mutex<T> + Send + Sync;
    type Monitor<T: Send>: Monitor<T> + Send + Sync;
    type AtomicU64: Counter + Send + Sync;
    /// Shard choice and the shards' own maps. Deterministic under a checker, which
    /// replays a schedule only if the program does the same thing again.
    type Hasher: BuildHasher + Default + Send + Sync;
    /// Number of shards of a [`ShardMap`].
    fn shards() -> usize;
}

/// A reader-writer lock used through closures, so no guard outlives the critical section
/// (no guard held across I/O, none returned to a caller).
pub trait RwLock<T> {
    fn new(value: T) -> Self;
    fn read<R>(&self, f: impl FnOnce(&T) -> R) -> R;
    fn write<R>(&self, f: impl FnOnce(&mut T) -> R) -> R;
}

/// A mutex used through closures, as [`RwLock`].
pub trait Mutex<T> {
    fn new(value: T) -> Self;
    fn lock<R>(&self, f: impl FnOnce(&mut T) -> R) -> R;
}

/// A value behind a mutex with a condition variable (a monitor): threads sleep until
/// an update makes true what they wait for.
pub trait Monitor<T> {
    fn new(value: T) -> Self;
    /// `f` under the lock, then wakes every waiter.
    fn update<R>(&self, f: impl FnOnce(&mut T) -> R) -> R;
    /// Sleeps until `f`, called under the lock at once and after every wake, says
    /// `Some`.
    fn wait_for<R>(&self, f: impl FnMut(&mut T) -> Option<R>) -> R;
}

/// A counter: unique numbers, statistics, queue lengths (relaxed ordering).
pub trait Counter {
    fn new(value: u64) -> Self;
    /// Adds `n`, returns the value before.
    fn fetch_add(&self, n: u64) -> u64;
    /// Subtracts `n`, returns the value before.
    fn fetch_sub(&self, n: u64) -> u64;
    fn get(&self) -> u64;
}

/// [`Monitor`] on parking_lot.
pub struct PlMonitor<T> {
    value: parking_lot::Mutex<T>,
    changed: parking_lot::Condvar,
}

impl<T> Monitor<T> for PlMonitor<T> {
    fn new(value: T) -> Self {
        PlMonitor {
            value: parking_lot::Mutex::new(value),
            changed: parking_lot::Condvar::new(),
        }
    }
    fn update<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        let r = f(&mut self.value.lock());
        self.changed.notify_all();
        r
    }
    fn wait_for<R>(&self, mut f: impl FnMut(&mut T) -> Option<R>) -> R {
        let mut g = self.value.lock();
        loop {
            if let Some(r) = f(&mut g) {
                return r;
            }
            self.changed.wait(&mut g);
        }
    }
}

/// The daemon's primitives.
pub struct Real;

impl Family for Real {
    type RwLock<T> = parking_lot::RwLock<T>;
    type Mutex<T: Send> = parking_lot::Mutex<T>;
    type Monitor<T: Send> = PlMonitor<T>;
    type AtomicU64 = std::sync::atomic::AtomicU64;
    type Hasher = std::hash::RandomState;

    /// As DashMap: four shards a core, a power of two.
    fn shards() -> usize {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        (cores * 4).next_power_of_two()
    }
}

impl<T> RwLock<T> for parking_lot::RwLock<T> {
    fn new(value: T) -> Self {
        parking_lot::RwLock::new(value)
    }
    fn read<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        f(&parking_lot::RwLock::read(self))
    }
    fn write<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        f(&mut parking_lot::RwLock::write(self))
    }
}

impl<T> Mutex<T> for parking_lot::Mutex<T> {
    fn new(value: T) -> Self {
        parking_lot::Mutex::new(value)
    }
    fn lock<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        f(&mut parking_lot::Mutex::lock(self))
    }
}

impl Counter for std::sync::atomic::AtomicU64 {
    fn new(value: u64) -> Self {
        std::sync::atomic::AtomicU64::new(value)
    }
    fn fetch_add(&self, n: u64) -> u64 {
        std::sync::atomic::AtomicU64::fetch_add(self, n, std::sync::atomic::Ordering::Relaxed)
    }
    fn fetch_sub(&self, n: u64) -> u64 {
        std::sync::atomic::AtomicU64::fetch_sub(self, n, std::sync::atomic::Ordering::Relaxed)
    }
    fn get(&self) -> u64 {
        std::sync::atomic::AtomicU64::load(self, std::sync::atomic::Ordering::Relaxed)
    }
}

/// shuttle's primitives: every lock and counter operation is a point where the checker
/// may switch threads. Only inside `shuttle::check_*`.
#[cfg(test)]
pub struct Shuttle;

#[cfg(test)]
impl Family for Shuttle {
    type RwLock<T> = shuttle::sync::RwLock<T>;
    type Mutex<T: Send> = shuttle::sync::Mutex<T>;
    type Monitor<T: Send> = ShuttleMonitor<T>;
    type AtomicU64 = shuttle::sync::atomic::AtomicU64;
    type Hasher = std::hash::BuildHasherDefault<std::collections::hash_map::DefaultHasher>;

    /// A few shards: some keys share a lock, some do not, as in the daemon.
    fn shards() -> usize {
        4
    }
}

#[cfg(test)]
impl<T> RwLock<T> for shuttle::sync::RwLock<T> {
    fn new(value: T) -> Self {
        shuttle::sync::RwLock::new(value)
    }
    // A poisoned lock means another thread of the test panicked: that panic fails it.
    fn read<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        f(&shuttle::sync::RwLock::read(self).unwrap_or_else(|e| e.into_inner()))
    }
    fn write<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        f(&mut shuttle::sync::RwLock::write(self).unwrap_or_else(|e| e.into_inner()))
    }
}

#[cfg(test)]
impl<T> Mutex<T> for shuttle::sync::Mutex<T> {
    fn new(value: T) -> Self {
        shuttle::sync::Mutex::new(value)
    }
    fn lock<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        f(&mut shuttle::sync::Mutex::lock(self).unwrap_or_else(|e| e.into_inner()))
    }
}

/// [`Monitor`] on shuttle's mutex and condition variable.
#[cfg(test)]
pub struct ShuttleMonitor<T> {
    value: shuttle::sync::Mutex<T>,
    changed: shuttle::sync::Condvar,
}

#[cfg(test)]
impl<T> Monitor<T> for ShuttleMonitor<T> {
    fn new(value: T) -> Self {
        ShuttleMonitor {
            value: shuttle::sync::Mutex::new(value),
            changed: shuttle::sync::Condvar::new(),
        }
    }
    fn update<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        let r = f(&mut self.value.lock().unwrap_or_else(|e| e.into_inner()));
        self.changed.notify_all();
        r
    }
    fn wait_for<R>(&self, mut f: impl FnMut(&mut T) -> Option<R>) -> R {
        let mut g = self.value.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(r) = f(&mut g) {
                return r;
            }
            g = self.changed.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }
}

#[cfg(test)]
impl Counter for shuttle::sync::atomic::AtomicU64 {
    fn new(value: u64) -> Self {
        shuttle::sync::atomic::AtomicU64::new(value)
    }
    fn fetch_add(&self, n: u64) -> u64 {
        shuttle::sync::atomic::AtomicU64::fetch_add(self, n, std::sync::atomic::Ordering::Relaxed)
    }
    fn fetch_sub(&self, n: u64) -> u64 {
        shuttle::sync::atomic::AtomicU64::fetch_sub(self, n, std::sync::atomic::Ordering::Relaxed)
    }
    fn get(&self) -> u64 {
        shuttle::sync::atomic::AtomicU64::load(self, std::sync::atomic::Ordering::Relaxed)
    }
}

/// A concurrent hash map: shards of a hash table behind the family's lock (what
/// DashMap is; one hash of the key picks the shard and the slot), used through closures
/// that run under the key's shard lock. A closure must not use the same map again (it
/// would wait on its own shard); it may use other maps, in one order for all callers.
/// Removed values are returned, so they drop after the lock.
pub struct ShardMap<K, V, S: Family = Real> {
    hasher: S::Hasher,
    /// log2 of the number of shards.
    bits: u32,
    shards: Box<[Shard<K, V, S>]>,
}

type Shard<K, V, S> = <S as Family>::RwLock<HashTable<(K, V)>>;

/// The entry of one key, under its shard's write lock (see [`ShardMap::entry`]).
pub struct Entry<'a, K, V> {
    key: K,
    slot: hash_table::Entry<'a, (K, V)>,
}

impl<'a, K, V> Entry<'a, K, V> {
    /// The value, if the key has one.
    pub fn get(&self) -> Option<&V> {
        match &self.slot {
            hash_table::Entry::Occupied(o) => Some(&o.get().1),
            hash_table::Entry::Vacant(_) => None,
        }
    }

    /// The value, made by `make` if the key had none.
    pub fn or_insert_with(self, make: impl FnOnce() -> V) -> &'a mut V {
        match self.slot {
            hash_table::Entry::Occupied(o) => &mut o.into_mut().1,
            hash_table::Entry::Vacant(v) => &mut v.insert((self.key, make())).into_mut().1,
        }
    }

    /// Removes the key's value and returns it.
    pub fn remove(self) -> Option<V> {
        match self.slot {
            hash_table::Entry::Occupied(o) => Some(o.remove().0 .1),
            hash_table::Entry::Vacant(_) => None,
        }
    }
}

impl<K: Hash + Eq, V, S: Family> Default for ShardMap<K, V, S> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Hash + Eq, V, S: Family> ShardMap<K, V, S> {
    pub fn new() -> Self {
        let n = S::shards().max(1).next_power_of_two();
        let shards = (0..n).map(|_| S::RwLock::new(HashTable::new())).collect();
        ShardMap {
            hasher: S::Hasher::default(),
            bits: n.trailing_zeros(),
            shards,
        }
    }

    /// The key's hash and its shard: the bits below the top 7 (the table keeps those in
    /// its control bytes, and indexes by the low bits), as DashMap does.
    fn locate<Q: Hash + ?Sized>(&self, key: &Q) -> (u64, &Shard<K, V, S>) {
        let h = self.hasher.hash_one(key);
        let i = match self.bits {
            0 => 0,
            b => (h << 7) >> (64 - b),
        };
        // i < 2^bits, the number of shards.
        (h, &self.shards[i as usize])
    }

    fn rehash(&self) -> impl Fn(&(K, V)) -> u64 + '_ {
        |(k, _)| self.hasher.hash_one(k)
    }

    /// `f` on the entry of `key`, under its shard's write lock.
    pub fn entry<R>(&self, key: K, f: impl FnOnce(Entry<'_, K, V>) -> R) -> R {
        let (h, shard) = self.locate(&key);
        shard.write(|t| {
            let slot = t.entry(h, |(k, _)| *k == key, self.rehash());
            f(Entry { key, slot })
        })
    }

    /// `f` on the value of `key`, if any, under its shard's write lock.
    pub fn update<Q, R>(&self, key: &Q, f: impl FnOnce(&mut V) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let (h, shard) = self.locate(key);
        shard.write(|t| t.find_mut(h, |(k, _)| k.borrow() == key).map(|(_, v)| f(v)))
    }

    /// `f` on the value of `key`, if any, under its shard's read lock.
    pub fn with<Q, R>(&self, key: &Q, f: impl FnOnce(&V) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let (h, shard) = self.locate(key);
        shard.read(|t| t.find(h, |(k, _)| k.borrow() == key).map(|(_, v)| f(v)))
    }

    /// A copy of the value of `key`.
    pub fn get<Q>(&self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
        V: Clone,
    {
        self.with(key, V::clone)
    }

    pub fn contains_key<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.with(key, |_| ()).is_some()
    }

    /// Sets the value of `key`; returns the one it replaced.
    pub fn insert(&self, key: K, value: V) -> Option<V> {
        let (h, shard) = self.locate(&key);
        shard.write(|t| match t.entry(h, |(k, _)| *k == key, self.rehash()) {
            hash_table::Entry::Occupied(mut o) => {
                Some(std::mem::replace(&mut o.get_mut().1, value))
            }
            hash_table::Entry::Vacant(v) => {
                v.insert((key, value));
                None
            }
        })
    }

    pub fn remove<Q>(&self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.remove_if(key, |_| true)
    }

    /// Removes `key` if `pred` holds for its value, decided under the shard's lock.
    pub fn remove_if<Q>(&self, key: &Q, pred: impl FnOnce(&V) -> bool) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let (h, shard) = self.locate(key);
        shard.write(|t| match t.find_entry(h, |(k, _)| k.borrow() == key) {
            Ok(o) if pred(&o.get().1) => Some(o.remove().0 .1),
            _ => None,
        })
    }

    /// `f` on every entry, one shard (read-locked) at a time: not a snapshot of the map
    /// as a whole.
    pub fn for_each(&self, mut f: impl FnMut(&K, &V)) {
        for s in self.shards.iter() {
            s.read(|t| t.iter().for_each(|(k, v)| f(k, v)));
        }
    }

    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.read(|t| t.len())).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.shards.iter().all(|s| s.read(|t| t.is_empty()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_map_basics() {
        let m: ShardMap<String, u64> = ShardMap::new();
        assert!(m.is_empty());
        for i in 0..100u64 {
            assert_eq!(m.insert(i.to_string(), i), None);
        }
        assert_eq!(m.len(), 100);
        assert_eq!(m.get("7"), Some(7));
        assert_eq!(m.with("7", |v| v + 1), Some(8));
        assert_eq!(m.update("7", |v| std::mem::replace(v, 70)), Some(7));
        assert_eq!(m.update("x", |v| *v), None);
        assert_eq!(m.remove_if("7", |v| *v == 7), None);
        assert_eq!(m.remove_if("7", |v| *v == 70), Some(70));
        assert!(!m.contains_key("7"));
        assert_eq!(m.entry("8".into(), |e| e.get().copied()), Some(8));
        m.entry("8".into(), |e| *e.or_insert_with(|| 0) += 1);
        assert_eq!(m.entry("x".into(), |e| e.remove()), None);
        assert_eq!(m.entry("x".into(), |e| *e.or_insert_with(|| 5)), 5);
        assert_eq!(m.entry("x".into(), |e| e.remove()), Some(5));
        assert_eq!(m.remove("8"), Some(9));
        let mut sum = 0;
        m.for_each(|_, v| sum += v);
        assert_eq!(sum, (0..100).sum::<u64>() - 7 - 8);
        assert_eq!(m.len(), 98);
        let used = m
            .shards
            .iter()
            .filter(|s| RwLock::read(*s, |t| !t.is_empty()))
            .count();
        assert!(
            used > 1 || m.shards.len() == 1,
            "keys spread over the shards"
        );
    }
}
