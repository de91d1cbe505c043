//! Locking the simulator's std mutexes.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks a std mutex, ignoring poisoning (the protected data stays consistent on panic).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
