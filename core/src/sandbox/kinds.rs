//! How the two other kinds of job run, beside a core module's run in
//! `mod.rs`: a component's `wasi:cli/run` ([`component`](super::component))
//! and a warm start — from its snapshot, or its prelude first
//! ([`warm`](super::warm)). Each in a fresh store, bounded as every job is.

use super::component::{CommandPre, ComponentWasi, MAX_CORE_INSTANCES};
use super::drive::drive;
use super::entry;
use super::outcome::Phase;
use std::sync::Arc;

use super::job_state::JobState;
use super::resident::{blank_state, charge};
use super::warm::{SnapshotImage, Start, key as warm_key, memory_of, restore, turn};
use super::{Bounds, JobIo, Ran, RunSpec};

impl super::Sandbox {
    /// Runs a component's `wasi:cli/run` in a fresh store: no scratch
    /// directory, read-only granted directories only (see [`component`]).
    pub(super) async fn run_component(
        &self,
        pre: &CommandPre,
        spec: &RunSpec,
        io: JobIo<'_>,
        bounds: Bounds,
    ) -> Result<Ran, String> {
        if let Some(d) = spec.dirs.iter().find(|d| !d.read_only) {
            return Err(format!(
                "a component gets read-only directories only, and {} is writable: grant it read-only (`:ro`) \
                 or build the job for wasm32-wasip1",
                d.guest
            ));
        }
        let wasi = self.build_wasi(spec, io, None)?.build();
        let wasi = ComponentWasi::new(wasi, self.config.max_open_files);
        let limiter = bounds.limiter.allowing_instances(MAX_CORE_INSTANCES);
        let mut store = self.store(&self.component_engine, wasi, limiter);
        let call = async {
            let command = pre
                .instantiate_async(&mut store)
                .await
                .map_err(|e| (Phase::Instantiate, e))?;
            match command.wasi_cli_run().call_run(&mut store).await {
                Ok(Ok(())) => Ok(()),
                // `run` returned its error: what a failing `main` exits with.
                Ok(Err(())) => Err((Phase::Run, wasmtime_wasi::I32Exit(1).into())),
                Err(e) => Err((Phase::Run, e)),
            }
        };
        let (ended, wall_time_us, cpu_time_us) = drive(call, bounds.deadline, &bounds.cancel).await;
        Ok(Ran {
            ended,
            wall_time_us,
            cpu_time_us,
            limiter: store.into_data().limiter,
        })
    }

    /// Runs a job of a warm start (see the module docs): in the instance a
    /// job of its snapshot left ([`resident`](super::resident)), else in a
    /// fresh store on the warm engine, from its snapshot or its prelude
    /// first. `Err` is why the job could not start.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn run_warm(
        &self,
        hash: crate::proto::ModuleHash,
        module: &wasmtime::Module,
        opens_files: bool,
        warm: &crate::proto::WarmStart,
        spec: &RunSpec,
        io: JobIo<'_>,
        bounds: Bounds,
    ) -> Result<Ran, String> {
        let pre = self
            .warm
            .module(&hash, module, |engine| self.cache.map_for(engine, &hash))?;
        let key = warm_key(spec, warm, opens_files);
        let resident = key.and_then(|k| self.residents.take(&k, |k| self.warm.holds(k)));
        let (state, _scratch) = self.core_state(opens_files, spec, io, bounds.limiter)?;
        let (mut store, mut resident, view) = match resident {
            Some(r) => {
                let (mut store, instance, image, view) = r.into_parts();
                *store.data_mut() = state;
                self.arm(&mut store);
                (store, Some((instance, image)), Some(view))
            }
            None => (self.store_of(self.warm.engine(), state), None, None),
        };
        // Set when the job's turn returned in an instance whose memory is
        // its snapshot's image: one the next job of the snapshot may have.
        let mut returned = None;
        let call = async {
            let (instance, image) = match resident.take() {
                Some((instance, image)) => {
                    let minimum = memory_minimum(module);
                    let len = image.file().1;
                    charge(&mut store.data_mut().limiter, minimum, len)
                        .map_err(|e| (Phase::Instantiate, e))?;
                    (instance, Some(image))
                }
                None => self.warm_instance(&pre, &mut store, key, warm).await?,
            };
            let status = turn(&mut store, &instance, &warm.turn)
                .await
                .map_err(|e| (Phase::Run, e))?;
            returned = image.map(|image| (instance, image));
            match status {
                0 => Ok(()),
                code => Err((Phase::Run, wasmtime_wasi::I32Exit(code).into())),
            }
        };
        let (ended, wall_time_us, cpu_time_us) = drive(call, bounds.deadline, &bounds.cancel).await;
        // The job's own state goes now: its descriptors, limits, lender.
        let limiter = std::mem::replace(store.data_mut(), blank_state()).limiter;
        if let (Some(key), Some((instance, image))) = (key, returned) {
            let warm = &self.warm;
            self.residents
                .keep(key, store, instance, image, view, |k| warm.holds(k));
        }
        Ok(Ran {
            ended,
            wall_time_us,
            cpu_time_us,
            limiter,
        })
    }

    /// A warm job's fresh instance in `store`, from its snapshot (and the
    /// image its memory now reads as) or with its prelude run first.
    async fn warm_instance(
        &self,
        pre: &wasmtime::InstancePre<JobState>,
        store: &mut wasmtime::Store<JobState>,
        key: Option<[u8; 32]>,
        warm: &crate::proto::WarmStart,
    ) -> Result<(wasmtime::Instance, Option<Arc<SnapshotImage>>), (Phase, wasmtime::Error)> {
        let start = self.warm.start(key).await;
        let instance = pre
            .instantiate_async(&mut *store)
            .await
            .map_err(|e| (Phase::Instantiate, e))?;
        match start {
            Start::From(image) => {
                restore(&mut *store, &instance, &image)
                    .await
                    .map_err(|e| (Phase::Instantiate, e))?;
                Ok((instance, Some(image)))
            }
            Start::Cold { keep } => {
                if let Ok(init) =
                    instance.get_typed_func::<(), ()>(&mut *store, entry::REACTOR_INIT)
                {
                    init.call_async(&mut *store, ())
                        .await
                        .map_err(|e| (Phase::Run, e))?;
                }
                let status = turn(&mut *store, &instance, &warm.prelude)
                    .await
                    .map_err(|e| (Phase::Run, e))?;
                if let Some(claim) = keep {
                    let memory = memory_of(&mut *store, &instance).map_err(|e| (Phase::Run, e))?;
                    if let Err(e) = self.warm.keep(claim, status, memory.data(&*store)) {
                        tracing::warn!("cannot keep a warm start's snapshot: {e}");
                    }
                }
                Ok((instance, None))
            }
        }
    }
}

/// The bytes a module's exported memory starts with (its minimum).
fn memory_minimum(module: &wasmtime::Module) -> usize {
    match module.get_export(super::warm::MEMORY) {
        Some(wasmtime::ExternType::Memory(m)) => {
            (m.minimum() as usize).saturating_mul(super::image::WASM_PAGE)
        }
        _ => 0,
    }
}
