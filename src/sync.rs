//! The synchronization primitives of the daemon's shared tables, as a [`Family`] the
//! tables are generic over: the real ones ([`Real`]: parking_lot, std atomics) in the
//! daemon, shuttle's ([`Shuttle`], tests only) in the concurrency tests. Why: a
//! concurrency checker schedules threads only at the primitives it provides, so a table
//! built on a lock it cannot see (DashMap's) gives it nothing to explore. The same table
//! code runs in both; only the lock and the counter differ. See "Concurrency tests
//! (shuttle)" in docs/reliability.md.

use std::borrow::Borrow;
use std::collections::hash_map::{self, HashMap};
use std::hash::{BuildHasher, Hash};

/// The primitives a table is built on.
pub trait Family: Sized + 'static {
    type RwLock<T>: RwLock<T>;
    type AtomicU64: Counter;
    /// Shard choice and the shards' own maps. Deterministic under a checker, which
    /// replays a schedule only if the program does the same thing again.
    type Hasher: BuildHasher + Default;
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

/// A counter handing out unique numbers.
pub trait Counter {
    fn new(value: u64) -> Self;
    /// Adds `n`, returns the value before.
    fn fetch_add(&self, n: u64) -> u64;
}

/// The daemon's primitives.
pub struct Real;

impl Family for Real {
    type RwLock<T> = parking_lot::RwLock<T>;
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

impl Counter for std::sync::atomic::AtomicU64 {
    fn new(value: u64) -> Self {
        std::sync::atomic::AtomicU64::new(value)
    }
    fn fetch_add(&self, n: u64) -> u64 {
        std::sync::atomic::AtomicU64::fetch_add(self, n, std::sync::atomic::Ordering::Relaxed)
    }
}

/// shuttle's primitives: every lock and counter operation is a point where the checker
/// may switch threads. Only inside `shuttle::check_*`.
#[cfg(test)]
pub struct Shuttle;

#[cfg(test)]
impl Family for Shuttle {
    type RwLock<T> = shuttle::sync::RwLock<T>;
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
impl Counter for shuttle::sync::atomic::AtomicU64 {
    fn new(value: u64) -> Self {
        shuttle::sync::atomic::AtomicU64::new(value)
    }
    fn fetch_add(&self, n: u64) -> u64 {
        shuttle::sync::atomic::AtomicU64::fetch_add(self, n, std::sync::atomic::Ordering::Relaxed)
    }
}

/// A concurrent hash map: shards of `HashMap` behind the family's lock (what DashMap
/// is), used through closures that run under the key's shard lock. A closure must not
/// use the same map again (it would wait on its own shard); it may use other maps, in one
/// order for all callers. Removed values are returned, so they drop after the lock.
pub struct ShardMap<K, V, S: Family = Real> {
    hasher: S::Hasher,
    shards: Box<[Shard<K, V, S>]>,
}

type Shard<K, V, S> = <S as Family>::RwLock<HashMap<K, V, <S as Family>::Hasher>>;

impl<K: Hash + Eq, V, S: Family> Default for ShardMap<K, V, S> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Hash + Eq, V, S: Family> ShardMap<K, V, S> {
    pub fn new() -> Self {
        let shards = (0..S::shards().max(1))
            .map(|_| S::RwLock::new(HashMap::with_hasher(S::Hasher::default())))
            .collect();
        ShardMap {
            hasher: S::Hasher::default(),
            shards,
        }
    }

    fn shard<Q: Hash + ?Sized>(&self, key: &Q) -> &Shard<K, V, S> {
        // High bits: the shards' maps index by the low ones.
        let h = self.hasher.hash_one(key) >> 32;
        // The modulo is below the shard count, a usize.
        &self.shards[(h % self.shards.len() as u64) as usize]
    }

    /// `f` on the entry of `key`, under its shard's write lock.
    pub fn entry<R>(&self, key: K, f: impl FnOnce(hash_map::Entry<'_, K, V>) -> R) -> R {
        self.shard(&key).write(|m| f(m.entry(key)))
    }

    /// `f` on the value of `key`, if any, under its shard's write lock.
    pub fn update<Q, R>(&self, key: &Q, f: impl FnOnce(&mut V) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.shard(key).write(|m| m.get_mut(key).map(f))
    }

    /// A copy of the value of `key`.
    pub fn get<Q>(&self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
        V: Clone,
    {
        self.shard(key).read(|m| m.get(key).cloned())
    }

    /// `f` on the value of `key`, if any, under its shard's read lock.
    pub fn with<Q, R>(&self, key: &Q, f: impl FnOnce(&V) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.shard(key).read(|m| m.get(key).map(f))
    }

    pub fn contains_key<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.shard(key).read(|m| m.contains_key(key))
    }

    pub fn insert(&self, key: K, value: V) -> Option<V> {
        self.shard(&key).write(|m| m.insert(key, value))
    }

    pub fn remove<Q>(&self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.shard(key).write(|m| m.remove(key))
    }

    /// Removes `key` if `pred` holds for its value, decided under the shard's lock.
    pub fn remove_if<Q>(&self, key: &Q, pred: impl FnOnce(&V) -> bool) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.shard(key).write(|m| match m.get(key) {
            Some(v) if pred(v) => m.remove(key),
            _ => None,
        })
    }

    /// `f` on every entry, one shard (read-locked) at a time: not a snapshot of the map
    /// as a whole.
    pub fn for_each(&self, mut f: impl FnMut(&K, &V)) {
        for s in self.shards.iter() {
            s.read(|m| m.iter().for_each(|(k, v)| f(k, v)));
        }
    }

    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.read(|m| m.len())).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.shards.iter().all(|s| s.read(|m| m.is_empty()))
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
        let fresh = m.entry("8".into(), |e| match e {
            hash_map::Entry::Occupied(mut o) => {
                *o.get_mut() += 1;
                false
            }
            hash_map::Entry::Vacant(_) => true,
        });
        assert!(!fresh);
        assert_eq!(m.remove("8"), Some(9));
        let mut sum = 0;
        m.for_each(|_, v| sum += v);
        assert_eq!(sum, (0..100).sum::<u64>() - 7 - 8);
        assert_eq!(m.len(), 98);
    }
}
