//! What a job's compile takes of the host's memory, charged to the ledger
//! while it runs ([`CompileCharge`]), once its tenant has a compile turn
//! (`compile_turns`).

use std::sync::Arc;

use super::job_path::JobPath;
use super::ledger::HoldKind;
use crate::sandbox::Cancel;

/// The memory a job's module takes to compile, charged to the ledger (a
/// [`Hold`] beside the reservations, taken even past its room: the compile
/// happens either way, and what the worker offers others must say so) from
/// when the job holds its slot until its module is loaded (`started`) or
/// the job ends — and a compile in a child process is ended with its job
/// (`runner::load` waits for that), so the charge lasts as long as the
/// compile does. It starts at what earlier compiles say a module of its
/// size takes (`sandbox::compile_memory`) and grows with the compile
/// child's resident memory, read every [`COMPILE_READING`], when that is
/// more. Only for a module this worker has not compiled yet, and
/// one compile of a tenant's at a time per two cores
/// (`compile_turns`): a tenant's burst of new modules waits
/// its turn rather than taking the machine.
pub(super) struct CompileCharge {
    pub(super) started: Arc<tokio::sync::Notify>,
    task: tokio::task::JoinHandle<()>,
}

/// How often a compile's charge is set against its child's resident
/// memory.
const COMPILE_READING: std::time::Duration = std::time::Duration::from_millis(20);

impl CompileCharge {
    /// The charge for `module`'s compile, once `tenant` has a compile turn
    /// (`Err`: the job was cancelled while it waited).
    pub(super) async fn for_module(
        w: &Arc<JobPath>,
        tenant: &str,
        module: &crate::proto::ModuleHash,
        cancel: &Cancel,
    ) -> Result<Option<CompileCharge>, crate::proto::CancelCause> {
        if w.runner.is_compiled(module) {
            return Ok(None);
        }
        let Some(bytes) = w.runner.module_bytes(module).map(|b| b.len() as u64) else {
            return Ok(None);
        };
        let turns = w.compile_turns.of(tenant);
        let turn = tokio::select! {
            biased;
            cause = cancel.cancelled() => return Err(cause),
            turn = turns.acquire_owned() => turn.ok(),
        };
        let hold = w.admission.ledger().hold(HoldKind::Compile);
        hold.try_grow(w.runner.sandbox().compile_memory().estimate(bytes), true);
        let started = Arc::new(tokio::sync::Notify::new());
        let task = tokio::spawn({
            let (started, w, module) = (started.clone(), w.clone(), *module);
            async move {
                let mut readings = tokio::time::interval(COMPILE_READING);
                loop {
                    tokio::select! {
                        _ = started.notified() => break,
                        _ = readings.tick() => {
                            let live = w.runner.sandbox().compile_memory().live(&module);
                            if let Some(more) = live.and_then(|l| l.checked_sub(hold.bytes())) {
                                hold.try_grow(more, true);
                            }
                        }
                    }
                }
                drop((hold, turn));
            }
        });
        Ok(Some(CompileCharge { started, task }))
    }
}

impl Drop for CompileCharge {
    fn drop(&mut self) {
        // The job ended without starting (a compile error, a cancel): the
        // task, and with it the hold, goes now.
        self.task.abort();
    }
}
