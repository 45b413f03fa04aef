//! Locking a mutex without giving up on a poisoned one.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `mutex`. A mutex is poisoned when a thread panicked holding it;
/// everything kept behind one here (caches, tables, counters) stays
/// usable after such a panic, so the guard is taken all the same rather
/// than the panic spreading to every later caller.
pub fn lock<T: ?Sized>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_mutex_is_locked_all_the_same() {
        let mutex = Mutex::new(1);
        let _ = std::panic::catch_unwind(|| {
            let _guard = mutex.lock();
            panic!("poison it");
        });
        assert!(mutex.is_poisoned());
        *lock(&mutex) += 1;
        assert_eq!(*lock(&mutex), 2);
    }
}
