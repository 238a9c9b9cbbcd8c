//! A job's store: its WASI context, its memory limiter, its file bounds and
//! its time limit armed. Built fresh for each job, or — for a resident
//! interpreter ([`resident`](super::resident)) — put into the store the last
//! job of its snapshot left, in place of that job's.

use wasmtime::{Engine, Store};

use super::job_state::JobState;
use super::limiter::MemoryLimiter;
use super::{JobIo, RunSpec, TimeLimitMechanism, engine, files};

impl super::Sandbox {
    /// A core module's job's store on `engine`, and its scratch directory
    /// if it can open files (held by the caller: dropped, and so deleted,
    /// when the job is done). `Err` is why the job cannot start.
    pub(super) fn core_store(
        &self,
        engine: &Engine,
        opens_files: bool,
        spec: &RunSpec,
        io: JobIo<'_>,
        limiter: MemoryLimiter,
    ) -> Result<(Store<JobState>, Option<super::scratch::Scratch>), String> {
        let (state, scratch) = self.core_state(opens_files, spec, io, limiter)?;
        Ok((self.store_of(engine, state), scratch))
    }

    /// What a core module's job's store holds, and its scratch directory
    /// (see [`core_store`](Self::core_store)).
    pub(super) fn core_state(
        &self,
        opens_files: bool,
        spec: &RunSpec,
        io: JobIo<'_>,
        limiter: MemoryLimiter,
    ) -> Result<(JobState, Option<super::scratch::Scratch>), String> {
        let scratch = opens_files
            .then(|| self.scratch_dir())
            .transpose()
            .map_err(|e| format!("cannot make a scratch directory: {e}"))?;
        let wasi = self
            .build_wasi(spec, io, scratch.as_ref().map(|d| d.path()))?
            .build_p1();
        Ok((self.job_state(wasi, limiter), scratch))
    }

    /// A job's store: its WASI, its memory limiter, its file bounds and the
    /// time-limit mechanism armed.
    pub(super) fn store<W: 'static>(
        &self,
        engine: &Engine,
        wasi: W,
        limiter: MemoryLimiter,
    ) -> Store<JobState<W>> {
        self.store_of(engine, self.job_state(wasi, limiter))
    }

    fn job_state<W>(&self, wasi: W, limiter: MemoryLimiter) -> JobState<W> {
        let files = files::FileUse::new(
            self.config.max_open_files,
            self.config.max_scratch_bytes.unwrap_or(u64::MAX),
            self.scratch.clone(),
        );
        JobState {
            wasi,
            limiter,
            files,
        }
    }

    pub(super) fn store_of<W: 'static>(
        &self,
        engine: &Engine,
        state: JobState<W>,
    ) -> Store<JobState<W>> {
        let mut store = Store::new(engine, state);
        store.limiter(|s| &mut s.limiter);
        self.arm(&mut store);
        store
    }

    /// Arms the time-limit mechanism for the job about to run in `store`
    /// (again, for a store a job before it used).
    pub(super) fn arm<W: 'static>(&self, store: &mut Store<JobState<W>>) {
        match self.config.time_limit {
            TimeLimitMechanism::Epoch => {
                store.set_epoch_deadline(1);
                store.epoch_deadline_async_yield_and_update(1);
            }
            TimeLimitMechanism::Fuel => {
                // Both only fail when fuel is not configured, which it is.
                let _ = store.set_fuel(u64::MAX);
                let _ = store.fuel_async_yield_interval(Some(engine::FUEL_YIELD_INTERVAL));
            }
            TimeLimitMechanism::Off => {}
        }
    }
}
