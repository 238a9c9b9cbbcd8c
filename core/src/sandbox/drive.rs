//! Running a job's call to its end: until it returns, its wall-time limit
//! passes or it is cancelled, whichever is first, counting the CPU time of
//! the thread that polls it. One place for both kinds of code (core
//! modules and components), so they end in the same ways.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use super::cancel::Cancel;
use crate::proto::CancelCause;

/// Runs a job's `call` (instantiate and run) until it ends, its deadline
/// passes or it is cancelled, counting its wall and CPU time.
pub(super) async fn drive<F>(
    call: F,
    deadline: Option<Duration>,
    cancel: &Cancel,
) -> (Result<F::Output, Stopped>, u64, u64)
where
    F: Future,
{
    let cpu_nanos = AtomicU64::new(0);
    let started = Instant::now();
    let ended = {
        let call = CpuTimed {
            inner: Box::pin(call),
            nanos: &cpu_nanos,
        };
        let timed = async {
            match deadline {
                Some(d) => tokio::time::timeout(d, call)
                    .await
                    .map_err(|_| Stopped::Elapsed),
                None => Ok(call.await),
            }
        };
        tokio::select! {
            biased;
            cause = cancel.cancelled() => Err(Stopped::Cancelled(cause)),
            ended = timed => ended,
        }
    };
    (
        ended,
        started.elapsed().as_micros() as u64,
        cpu_nanos.load(Ordering::Relaxed) / 1000,
    )
}

/// Why a job's call stopped before it returned.
pub(super) enum Stopped {
    /// The wall-time limit ran out.
    Elapsed,
    /// Someone cancelled it.
    Cancelled(CancelCause),
}

/// Adds up the CPU time of the polling thread while the inner future is
/// polled. A job runs only inside `poll`, so this is the job's CPU time
/// (blocking file I/O that WASI hands to other threads is not counted).
struct CpuTimed<'a, F> {
    inner: Pin<Box<F>>,
    nanos: &'a AtomicU64,
}

impl<F: Future> Future for CpuTimed<'_, F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let before = thread_cpu_nanos();
        let out = self.inner.as_mut().poll(cx);
        self.nanos
            .fetch_add(thread_cpu_nanos().saturating_sub(before), Ordering::Relaxed);
        out
    }
}

/// CPU time of the calling thread, in nanoseconds.
fn thread_cpu_nanos() -> u64 {
    cpu_clock_nanos(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// A CPU-time clock (`CLOCK_THREAD_CPUTIME_ID`, `CLOCK_PROCESS_CPUTIME_ID`),
/// in nanoseconds; 0 if it cannot be read.
pub(crate) fn cpu_clock_nanos(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write to.
    let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
    if rc != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
