//! A map whose results Python reads as they come: [`MapStream`], the
//! iterator under `peerwasm.map`, `imap` and `imap_unordered`.
//!
//! The map runs as a task on the runtime, so it goes on submitting while
//! Python does something else with the results it has; its observer sends
//! each finished item down a channel (in input order, or as it arrives),
//! and `__next__` waits for the next one with the GIL released, checking
//! for Ctrl-C every 100 ms. Results sent and not yet taken count in the
//! map's window (`MapObserver::unread`): a Python loop slower than the map
//! holds it at `reorder_window` results, not at every result of the map. Ctrl-C (or `close`, or the stream being
//! dropped) interrupts the map: nothing more is submitted, what is under
//! way is cancelled, and the results already in are still handed over
//! (`rest`), so a caller keeps what was done.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use peerwasm::client::map::{MapObserver, MapSummary, Progress};
use peerwasm::client::{Job, MapConfig, MapItem, Target};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::{Result, block_on, job_error, runtime, to_result};

/// How long `rest` waits for an interrupted map to hand over what it has.
const REST_WAIT: Duration = Duration::from_secs(5);

/// Sends each item to the stream; keeps the latest progress for it.
struct Sender {
    tx: mpsc::UnboundedSender<MapItem>,
    /// Items sent that Python has not taken: the map waits for them
    /// past its window (`MapObserver::unread`), so the channel holds at
    /// most that many, however slowly Python reads.
    unread: Arc<AtomicUsize>,
    progress: Arc<Mutex<Progress>>,
}

impl MapObserver for Sender {
    fn result(&mut self, item: MapItem) -> anyhow::Result<()> {
        // The stream gone (dropped by Python): the map stops here.
        self.unread.fetch_add(1, Ordering::Relaxed);
        self.tx
            .send(item)
            .map_err(|_| anyhow::anyhow!("the map's reader is gone"))
    }

    fn unread(&self) -> usize {
        self.unread.load(Ordering::Relaxed)
    }

    fn progress(&mut self, p: &Progress) {
        if let Ok(mut slot) = self.progress.lock() {
            *slot = p.clone();
        }
    }
}

/// The results of a map as they come: each a `Result` with its `index`.
/// A failed job raises `JobError` (and ends the stream) unless the map
/// keeps going; Ctrl-C raises `KeyboardInterrupt` and interrupts the map
/// (its results already in are then `rest()`).
#[pyclass(module = "peerwasm")]
pub struct MapStream {
    rx: mpsc::UnboundedReceiver<MapItem>,
    /// Items in `rx` (the map's [`Sender`] counts them in).
    unread: Arc<AtomicUsize>,
    task: Option<tokio::task::JoinHandle<anyhow::Result<MapSummary>>>,
    interrupt: CancellationToken,
    progress: Arc<Mutex<Progress>>,
    keep_going: bool,
    /// Set once the stream has ended (raised its failure, or finished).
    ended: bool,
    /// What must outlive the map's jobs (a Python program's directory).
    _holds: Option<Box<dyn std::any::Any + Send + Sync>>,
}

impl MapStream {
    /// Starts `job` over `stdins` on `target`; `holds` is kept as long as
    /// the stream is.
    pub fn start(
        job: Job,
        stdins: Vec<Vec<u8>>,
        mut config: MapConfig,
        target: Target,
        holds: Option<Box<dyn std::any::Any + Send + Sync>>,
    ) -> Self {
        let interrupt = CancellationToken::new();
        config.interrupt = Some(interrupt.clone());
        let keep_going = config.keep_going;
        let (tx, rx) = mpsc::unbounded_channel();
        let progress = Arc::new(Mutex::new(Progress {
            total: Some(stdins.len() as u64),
            ..Progress::default()
        }));
        let unread = Arc::new(AtomicUsize::new(0));
        let mut sender = Sender {
            tx,
            unread: unread.clone(),
            progress: progress.clone(),
        };
        let task = runtime().spawn(async move {
            peerwasm::client::map(&target, &job, stdins, &config, &mut sender).await
        });
        MapStream {
            rx,
            unread,
            task: Some(task),
            interrupt,
            progress,
            keep_going,
            ended: false,
            _holds: holds,
        }
    }

    /// The map's summary once every item is out: learned memory recorded,
    /// its error raised.
    fn finish(&mut self, py: Python<'_>) -> PyResult<()> {
        self.ended = true;
        let Some(task) = self.task.take() else {
            return Ok(());
        };
        let summary = block_on(py, task)
            .inspect_err(|_| self.interrupt.cancel())?
            .map_err(|e| PyRuntimeError::new_err(format!("the map failed: {e}")))?
            .map_err(|e| PyRuntimeError::new_err(format!("{e:#}")))?;
        crate::set_learned(summary.learned_model.map(|m| m.describe()));
        if summary.stopped.is_some() && !summary.interrupted {
            return Err(PyRuntimeError::new_err(
                "the map stopped without a failed result",
            ));
        }
        Ok(())
    }
}

impl Drop for MapStream {
    fn drop(&mut self) {
        // Left unread (a `for` loop broken out of): its jobs are cancelled.
        self.interrupt.cancel();
    }
}

#[pymethods]
impl MapStream {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self, py: Python<'_>) -> PyResult<Option<Result>> {
        if self.ended {
            return Ok(None);
        }
        let rx = &mut self.rx;
        let next = match block_on(py, rx.recv()) {
            Ok(next) => next,
            Err(e) => {
                // Ctrl-C: stop the map; what it had is `rest()`.
                self.interrupt.cancel();
                return Err(e);
            }
        };
        let Some(item) = next else {
            self.finish(py)?;
            return Ok(None);
        };
        self.unread.fetch_sub(1, Ordering::Relaxed);
        let failed = !item.succeeded();
        let result = to_result(py, item.result, item.attempts, Some(item.index))?;
        if failed && !self.keep_going {
            self.ended = true;
            self.interrupt.cancel();
            return Err(job_error(py, result)?);
        }
        Ok(Some(result))
    }

    /// Stops the map: nothing more is submitted and what is under way is
    /// cancelled. The results already in stay readable (`rest`).
    fn close(&mut self) {
        self.interrupt.cancel();
    }

    /// After an interrupt: the results that were in, as the map hands them
    /// over (waiting at most 5 s); the stream is then over.
    fn rest(&mut self, py: Python<'_>) -> PyResult<Vec<Result>> {
        self.interrupt.cancel();
        let rx = &mut self.rx;
        let items = block_on(py, async {
            let mut items = Vec::new();
            let _ = tokio::time::timeout(REST_WAIT, async {
                while let Some(item) = rx.recv().await {
                    items.push(item);
                }
            })
            .await;
            items
        })?;
        self.ended = true;
        items
            .into_iter()
            .map(|i| to_result(py, i.result, i.attempts, Some(i.index)))
            .collect()
    }

    /// Where the map is: `(done, failed, retried, in_flight)`.
    #[getter]
    fn progress(&self) -> (u64, u64, u64, usize) {
        let p = self.progress.lock().map(|p| p.clone()).unwrap_or_default();
        (p.done, p.failed, p.retried, p.in_flight)
    }
}
