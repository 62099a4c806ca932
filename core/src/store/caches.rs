//! Bounded in-memory maps the store keeps beside the database: facts that never change once
//! written (a session's run, a run's tenant) or hints that grant nothing (a session's last
//! agent and run). An entry is never wrong, only possibly stale in a run's mutable fields;
//! past its bound a map starts afresh rather than evicting one by one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A map from text keys to `V`, shared by clones, cleared when it holds `max` entries.
#[derive(Clone)]
pub(crate) struct Bounded<V> {
    map: Arc<Mutex<HashMap<String, V>>>,
    max: usize,
}

impl<V: Clone> Bounded<V> {
    /// An empty map of at most `max` entries.
    pub(crate) fn new(max: usize) -> Self {
        Self {
            map: Arc::default(),
            max,
        }
    }

    /// The value remembered for `key`, if any.
    pub(crate) fn get(&self, key: &str) -> Option<V> {
        self.map.lock().ok()?.get(key).cloned()
    }

    /// Remembers `value` for `key` (a poisoned lock remembers nothing).
    pub(crate) fn put(&self, key: &str, value: V) {
        if let Ok(mut map) = self.map.lock() {
            if map.len() >= self.max {
                map.clear();
            }
            map.insert(key.to_string(), value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_map_starts_afresh() {
        let m = Bounded::new(2);
        m.put("a", 1);
        m.put("b", 2);
        assert_eq!(m.get("a"), Some(1));
        m.put("c", 3);
        assert_eq!(m.get("a"), None, "cleared when full");
        assert_eq!(m.get("c"), Some(3));
        let clone = m.clone();
        clone.put("d", 4);
        assert_eq!(m.get("d"), Some(4), "clones share the map");
    }
}
