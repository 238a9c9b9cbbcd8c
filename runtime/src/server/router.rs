//! Every route of the worker's HTTP API, each to its endpoint file, behind
//! the protocol check.

use std::sync::Arc;

use axum::Router;
use axum::routing::{get, post, put};

use super::{batch, extract, files, jobs, modules, pool, stream, submissions};
use crate::owner::Owner;
use crate::worker::state::Worker;

/// Every route, behind the protocol check. The submission endpoints get
/// the worker's [`Owner`] as an extension; the controller's, its pool
/// directory (`--pool-dir`), if it has one.
pub(super) fn router(
    worker: Arc<Worker>,
    owner: Arc<Owner>,
    pool_dir: Option<super::pooldir::PoolDir>,
) -> Router {
    use crate::proto::routes;
    // Requests with a tenant's body: the tenant first, then the body.
    let uploads = Router::new()
        .route(routes::MODULE, put(modules::put_module))
        .route(routes::TREE, put(files::put_tree))
        .route(routes::FILE, put(files::put_file))
        .route(routes::JOBS, post(jobs::post_job))
        .route(routes::BATCH, post(batch::post_batch))
        .route(routes::STREAM, post(stream::post_stream))
        .route(routes::SUBMISSIONS, post(submissions::post_submission))
        .route(routes::BACKLOG, post(pool::post_backlog))
        .route_layer(axum::middleware::from_fn_with_state(
            worker.clone(),
            extract::tenant_first,
        ));
    Router::new()
        .merge(uploads)
        .route(routes::STATUS_PAGE, get(pool::status_page))
        .route(routes::JOBS, get(jobs::list_jobs))
        .route(routes::JOB, get(jobs::get_job).delete(jobs::delete_job))
        .route(routes::JOB_OUTPUT, get(jobs::get_output))
        .route(routes::SUBMISSIONS, get(submissions::list_submissions))
        .route(
            routes::SUBMISSION,
            get(submissions::get_submission).delete(submissions::delete_submission),
        )
        .route(routes::SUBMISSION_RESULTS, get(submissions::get_results))
        .route(routes::HISTORY, get(submissions::get_history))
        .route(routes::GOSSIP, post(pool::post_gossip))
        .route(routes::PEERS, get(pool::get_peers))
        .route(routes::CONTROLLER, get(pool::get_controller))
        .route(routes::METRICS, get(pool::get_metrics))
        .layer(axum::Extension(owner))
        .layer(axum::Extension(pool_dir))
        .layer(axum::middleware::from_fn(extract::protocol))
        .layer(axum::middleware::from_fn(super::response::nosniff))
        .layer(axum::middleware::from_fn(super::serve::in_flight))
        .with_state(worker)
}
