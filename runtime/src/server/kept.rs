//! What a worker keeps across restarts, put back when it starts and
//! forgotten when it expires: detached jobs, owned submissions (resumed),
//! history. Both a served worker (`start`) and one in memory (`memory`)
//! run these.

use std::sync::Arc;
use std::time::Duration;

use crate::owner::Owner;

/// How often what expired is forgotten (or more often, with a shorter
/// `--keep-results`).
pub const EXPIRE_EVERY: Duration = Duration::from_secs(3600);

/// What expired is forgotten, then kept detached jobs are put back: before
/// the worker answers anyone, so a job it kept is never "no such job" just
/// after a restart.
pub(super) async fn restore_state(o: &Arc<Owner>, keep_results: Duration) {
    expire_state(o, keep_results).await;
    match crate::worker::restore::detached_jobs(&o.jobs).await {
        Ok((0, 0)) => {}
        Ok((results, rerun)) => tracing::info!(results, rerun, "restored kept detached jobs"),
        Err(e) => tracing::error!("cannot restore the kept detached jobs: {e:#}"),
    }
}

/// Forgets old history, and finished detached jobs and submissions older
/// than `keep_results`.
async fn expire_state(o: &Arc<Owner>, keep_results: Duration) {
    let w = &o.jobs;
    w.kept.history.expire();
    w.uploaders.expire();
    match crate::worker::detached::expire(w, keep_results).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(
            jobs = n,
            "forgot detached jobs that ended past --keep-results"
        ),
        Err(e) => tracing::warn!("cannot forget old detached jobs: {e:#}"),
    }
    if let Err(e) = o.submissions.expire(keep_results).await {
        tracing::warn!("cannot forget old submissions: {e:#}");
    }
}

/// Resumes the submissions this worker owns (they submit to it, so it
/// serves first); then, every [`EXPIRE_EVERY`], forgets what expired.
pub(super) async fn keep_state(o: Arc<Owner>, keep_results: Duration) {
    match crate::owner::run::resume_all(&o).await {
        Ok(0) => {}
        Ok(n) => {
            tracing::info!(submissions = n, state_dir = %o.jobs.kept.db.dir().display(), "resumed owned submissions")
        }
        Err(e) => tracing::error!("cannot resume the owned submissions: {e:#}"),
    }
    let mut every =
        tokio::time::interval(EXPIRE_EVERY.min(keep_results.max(Duration::from_secs(1))));
    every.tick().await; // the first tick is now: expired at start
    loop {
        every.tick().await;
        expire_state(&o, keep_results).await;
    }
}
