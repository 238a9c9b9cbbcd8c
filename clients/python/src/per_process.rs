//! Values made once per process — the tokio runtime, the embedded worker —
//! and made again in a forked child.
//!
//! Why: a child forked from a process that made one (`multiprocessing`'s
//! fork start method, the default on Linux before Python 3.14; a
//! `Pool` whose workers call `peerwasm.run`) inherits the parent's memory
//! but none of its threads and none of its slot processes. A `OnceLock`
//! would hand the child the parent's runtime, whose worker threads are not
//! there, and its first call would wait for ever. So the process id is
//! kept beside the value, and a child makes its own. The parent's copy is
//! left as it is in the child (never dropped: dropping a runtime waits for
//! threads that do not exist there).

use std::sync::Mutex;

/// A value made once per process; see the module docs.
pub struct PerProcess<T: 'static>(Mutex<Option<(u32, &'static T)>>);

impl<T: 'static> PerProcess<T> {
    /// Empty: the first [`get_or_try_init`](Self::get_or_try_init) makes it.
    pub const fn new() -> Self {
        Self(Mutex::new(None))
    }

    /// This process's value, made by `make` if this process has none yet.
    /// `make` runs without the lock held (it may wait for Python's lock);
    /// two threads that race both make one, and the first to store it
    /// wins.
    pub fn get_or_try_init<E>(&self, make: impl FnOnce() -> Result<T, E>) -> Result<&'static T, E> {
        let pid = std::process::id();
        if let Some(value) = self.mine(pid) {
            return Ok(value);
        }
        let made = make()?;
        let mut slot = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match *slot {
            Some((owner, value)) if owner == pid => Ok(value),
            _ => {
                let value: &'static T = Box::leak(Box::new(made));
                *slot = Some((pid, value));
                Ok(value)
            }
        }
    }

    fn mine(&self, pid: u32) -> Option<&'static T> {
        let slot = self.0.lock().unwrap_or_else(|e| e.into_inner());
        slot.filter(|(owner, _)| *owner == pid)
            .map(|(_, value)| value)
    }
}
