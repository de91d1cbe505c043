//! The LoRA adapters the engine has loaded, in load order: vLLM's runtime load/unload API and
//! Dynamo's `/v1/loras` system API both edit this one list.

use std::sync::Mutex;

use crate::lock::lock;

/// Loaded adapters as (lora_name, lora_path).
#[derive(Debug, Default)]
pub struct LoraRegistry {
    adapters: Mutex<Vec<(String, String)>>,
}

impl LoraRegistry {
    /// A registry holding these adapters.
    pub fn new(initial: &[(String, String)]) -> Self {
        let reg = Self::default();
        for (name, path) in initial {
            reg.upsert(name, path);
        }
        reg
    }

    /// Loads a new adapter; false if the name is already loaded.
    pub fn insert(&self, name: &str, path: &str) -> bool {
        let mut adapters = lock(&self.adapters);
        if adapters.iter().any(|(n, _)| n == name) {
            return false;
        }
        adapters.push((name.to_owned(), path.to_owned()));
        true
    }

    /// Loads or re-points an adapter (Dynamo's load is idempotent).
    pub fn upsert(&self, name: &str, path: &str) {
        let mut adapters = lock(&self.adapters);
        match adapters.iter_mut().find(|(n, _)| n == name) {
            Some(entry) => entry.1 = path.to_owned(),
            None => adapters.push((name.to_owned(), path.to_owned())),
        }
    }

    /// Unloads an adapter; false if it was not loaded.
    pub fn remove(&self, name: &str) -> bool {
        let mut adapters = lock(&self.adapters);
        let before = adapters.len();
        adapters.retain(|(n, _)| n != name);
        adapters.len() != before
    }

    /// Whether the name is a loaded adapter.
    pub fn contains(&self, name: &str) -> bool {
        lock(&self.adapters).iter().any(|(n, _)| n == name)
    }

    /// A copy of the list.
    pub fn list(&self) -> Vec<(String, String)> {
        lock(&self.adapters).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_remove_upsert() {
        let reg = LoraRegistry::new(&[("a".into(), "/a".into())]);
        assert!(!reg.insert("a", "/x"));
        assert!(reg.insert("b", "/b"));
        reg.upsert("a", "/a2");
        assert_eq!(
            reg.list(),
            vec![("a".into(), "/a2".into()), ("b".into(), "/b".into())]
        );
        assert!(reg.remove("a"));
        assert!(!reg.remove("a"));
        assert!(!reg.contains("a"));
        assert!(reg.contains("b"));
    }
}
