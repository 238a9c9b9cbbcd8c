//! The worker's HTTP API in one place: every route as the worker's router
//! matches it, and the URLs a client asks for built from the same
//! constants, so the two ends cannot drift apart.
//!
//! A route with a parameter is written as axum matches it (`{hash}`,
//! `{id}`); [`path`] fills the parameter in on the client's side. The
//! scheme and host are the transport's (`net::Transport::url`).
//!
//! ```
//! use peerwasm_core::proto::{ModuleHash, routes};
//! let hash = ModuleHash::of(b"\0asm\x01\0\0\0");
//! assert_eq!(routes::path(routes::MODULE, &hash.to_hex()), format!("/v1/modules/{hash}"));
//! ```

/// `PUT` a module's bytes under their sha256 (hex).
pub const MODULE: &str = "/v1/modules/{hash}";
/// `PUT` a shipped directory's manifest under its sha256 (hex).
pub const TREE: &str = "/v1/trees/{hash}";
/// `PUT` one file of a shipped directory under its sha256 (hex).
pub const FILE: &str = "/v1/files/{hash}";
/// `POST` a job and wait for its result (`?detach=true`: start it and
/// answer its id); `GET` the jobs of the caller on this worker.
pub const JOBS: &str = "/v1/jobs";
/// `POST` many jobs in one request; results come back as they end.
pub const BATCH: &str = "/v1/jobs/batch";
/// `POST` a job whose stdin and stdout stream while it runs.
pub const STREAM: &str = "/v1/jobs/stream";
/// `GET` a detached job's state; `DELETE` cancels it.
pub const JOB: &str = "/v1/jobs/{id}";
/// `GET` a detached job's output from given offsets.
pub const JOB_OUTPUT: &str = "/v1/jobs/{id}/output";
/// `POST` a durable submission (a detached map); `GET` the caller's.
pub const SUBMISSIONS: &str = "/v1/submissions";
/// `GET` one submission's progress; `DELETE` cancels it.
pub const SUBMISSION: &str = "/v1/submissions/{id}";
/// `GET` a submission's results from an index, waiting for the next ones.
pub const SUBMISSION_RESULTS: &str = "/v1/submissions/{id}/results";
/// `POST` what a running map still has to run (`backlog::Backlog`).
pub const BACKLOG: &str = "/v1/backlog";
/// `GET` the submissions that ended since a time.
pub const HISTORY: &str = "/v1/history";
/// `POST` one gossip message between workers.
pub const GOSSIP: &str = "/v1/gossip";
/// `GET` the pool as this worker sees it.
pub const PEERS: &str = "/v1/peers";
/// `GET` what the controller growing this worker's pool directory is doing
/// (`peerwasm adapt`'s notice), or `null`.
pub const CONTROLLER: &str = "/v1/pool/controller";
/// `GET` Prometheus metrics.
pub const METRICS: &str = "/metrics";
/// `GET` the status page (HTML).
pub const STATUS_PAGE: &str = "/";

/// Every route, for checks that walk them all.
pub const ALL: [&str; 18] = [
    MODULE,
    TREE,
    FILE,
    JOBS,
    BATCH,
    STREAM,
    JOB,
    JOB_OUTPUT,
    SUBMISSIONS,
    SUBMISSION,
    SUBMISSION_RESULTS,
    HISTORY,
    BACKLOG,
    GOSSIP,
    PEERS,
    CONTROLLER,
    METRICS,
    STATUS_PAGE,
];

/// `route` with its one `{…}` parameter replaced by `value` (which must
/// not hold a `/`: ids and hex hashes never do).
pub fn path(route: &str, value: &str) -> String {
    debug_assert!(!value.contains('/'), "a path parameter holds no '/'");
    match (route.find('{'), route.find('}')) {
        (Some(open), Some(close)) if open < close => {
            format!("{}{value}{}", &route[..open], &route[close + 1..])
        }
        _ => route.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filled_in_route_is_what_the_router_matches() {
        assert_eq!(path(JOB_OUTPUT, "j-17"), "/v1/jobs/j-17/output");
        assert_eq!(path(SUBMISSION, "s-2"), "/v1/submissions/s-2");
        assert_eq!(
            path(JOBS, "ignored"),
            "/v1/jobs",
            "a route without a parameter is itself"
        );
    }

    #[test]
    fn every_route_is_versioned_has_at_most_one_parameter_and_is_listed_once() {
        let mut seen = std::collections::HashSet::new();
        for route in ALL {
            assert!(seen.insert(route), "{route} listed twice");
            assert!(
                route.starts_with("/v1/") || route == METRICS || route == STATUS_PAGE,
                "{route}"
            );
            assert!(route.matches('{').count() <= 1, "{route}");
        }
    }
}
