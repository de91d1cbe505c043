//! One ACQUIRE in flight per key: a request whose credit ran out waits for the ACQUIRE already
//! asking Redis for that key, then looks at its credit again, instead of sending its own. Without
//! it a burst of one tenant costs one Redis call per request (every request finds no credit until
//! the first answer lands). The map is held only to look up or register, never across a Redis
//! call; a flight ends when its guard drops (answer booked, call failed, or request abandoned).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use tokio::sync::watch;

use super::plan::Key;

/// The ACQUIREs in flight on this replica, by the check keys they ask credit for.
#[derive(Default)]
pub struct Flights {
    /// Per key: the flight asking for it (its number) and the signal of its end.
    asking: Mutex<HashMap<Key, (u64, watch::Receiver<()>)>>,
    last_id: AtomicU64,
}

/// What a request whose credit ran out does next.
pub enum Turn<'a> {
    /// Another request is asking for one of these keys: wait for it to end, then look again.
    Wait(watch::Receiver<()>),
    /// Ask Redis; the keys are marked as asked for until the guard drops.
    Lead(FlightGuard<'a>),
}

/// Marks keys as asked for; dropping it ends the flight and wakes its waiters.
pub struct FlightGuard<'a> {
    flights: &'a Flights,
    id: u64,
    keys: Vec<Key>,
    _done: watch::Sender<()>,
}

impl Flights {
    /// Waits behind a flight asking for any of `keys`, or starts one for all of them.
    pub fn join(&self, keys: Vec<Key>) -> Turn<'_> {
        let Ok(mut map) = self.asking.lock() else {
            let (done, _) = watch::channel(());
            return Turn::Lead(FlightGuard {
                flights: self,
                id: 0,
                keys: Vec::new(),
                _done: done,
            });
        };
        if let Some((_, rx)) = keys.iter().find_map(|k| map.get(k)) {
            return Turn::Wait(rx.clone());
        }
        let id = self.last_id.fetch_add(1, Ordering::Relaxed) + 1;
        let (done, rx) = watch::channel(());
        for k in &keys {
            map.insert(k.clone(), (id, rx.clone()));
        }
        Turn::Lead(FlightGuard {
            flights: self,
            id,
            keys,
            _done: done,
        })
    }

    /// How many keys are asked for now (for tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.asking.lock().map_or(0, |m| m.len())
    }
}

impl Drop for FlightGuard<'_> {
    fn drop(&mut self) {
        let Ok(mut map) = self.flights.asking.lock() else {
            return;
        };
        for k in &self.keys {
            if map.get(k).is_some_and(|(id, _)| *id == self.id) {
                map.remove(k);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::quota::flight::*; // not `super`: scripts/import-cycles.py reads it as the parent

    #[tokio::test]
    async fn waiters_wake_when_the_flight_ends() {
        let f = Flights::default();
        let Turn::Lead(lead) = f.join(vec!["a".into(), "b".into()]) else {
            panic!("nobody asks yet");
        };
        let Turn::Wait(mut rx) = f.join(vec!["b".into(), "c".into()]) else {
            panic!("b is asked for");
        };
        assert!(
            matches!(f.join(vec!["c".into()]), Turn::Lead(_)),
            "c is free"
        );
        drop(lead);
        assert_eq!(f.len(), 0);
        assert!(rx.changed().await.is_err(), "the flight ended");
    }
}
