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

use serde::{Deserialize, Serialize};

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

/// An HTTP method of the worker's API.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Method {
    Get,
    Put,
    Post,
    Delete,
}

impl Method {
    /// Its name on the wire (`GET`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Put => "PUT",
            Method::Post => "POST",
            Method::Delete => "DELETE",
        }
    }
}

/// How a body (a request's or an answer's) is encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// No body.
    None,
    /// postcard ([`POSTCARD`](super::POSTCARD)): the wire types.
    Postcard,
    /// postcard, or JSON if the caller does not accept postcard.
    PostcardOrJson,
    /// JSON: what a person or a script may read too.
    Json,
    /// A stream of postcard frames (`proto::frame`), as they are written.
    Frames,
    /// Raw bytes (a module, a file).
    Bytes,
    /// Text: Prometheus metrics, or the status page (HTML if asked for).
    Text,
}

/// One row of [`TABLE`]: a route, one method on it, what it takes and what
/// it answers. The client's method for it is named in `client`
/// (`WorkerApi::…`, or the gossip transport's).
#[derive(Clone, Copy, Debug)]
pub struct Route {
    pub method: Method,
    pub path: &'static str,
    /// Its query's type (in this module), if it takes one.
    pub query: Option<&'static str>,
    pub body: Encoding,
    /// The status of success.
    pub ok: u16,
    pub answer: Encoding,
    /// Who calls it on the client's side.
    pub client: &'static str,
}

const fn row(
    method: Method,
    path: &'static str,
    query: Option<&'static str>,
    body: Encoding,
    ok: u16,
    answer: Encoding,
    client: &'static str,
) -> Route {
    Route {
        method,
        path,
        query,
        body,
        ok,
        answer,
        client,
    }
}

/// Every route and method of the worker's API: the router serves exactly
/// these (a test walks it against the router), and the client's requests
/// are these (a test walks `WorkerApi` against it).
pub const TABLE: [Route; 22] = {
    use Encoding as E;
    use Method::*;
    [
        row(
            Put,
            MODULE,
            None,
            E::Bytes,
            201,
            E::None,
            "WorkerApi::put_module",
        ),
        row(
            Put,
            TREE,
            None,
            E::Postcard,
            200,
            E::Postcard,
            "WorkerApi::put_tree",
        ),
        row(
            Put,
            FILE,
            None,
            E::Bytes,
            201,
            E::None,
            "WorkerApi::put_file",
        ),
        row(
            Post,
            JOBS,
            Some("PostJobQuery"),
            E::Postcard,
            200,
            E::Postcard,
            "WorkerApi::post_job",
        ),
        row(Get, JOBS, None, E::None, 200, E::Json, "WorkerApi::jobs"),
        row(
            Post,
            BATCH,
            None,
            E::Postcard,
            200,
            E::Frames,
            "WorkerApi::post_batch",
        ),
        row(
            Post,
            STREAM,
            None,
            E::Frames,
            200,
            E::Frames,
            "WorkerApi::post_stream",
        ),
        row(
            Get,
            JOB,
            None,
            E::None,
            200,
            E::Json,
            "peerwasm jobs (by hand)",
        ),
        row(
            Delete,
            JOB,
            None,
            E::None,
            200,
            E::Json,
            "WorkerApi::cancel_job",
        ),
        row(
            Get,
            JOB_OUTPUT,
            Some("OutputQuery"),
            E::None,
            200,
            E::Postcard,
            "WorkerApi::job_output",
        ),
        row(
            Post,
            SUBMISSIONS,
            None,
            E::Postcard,
            201,
            E::Json,
            "WorkerApi::post_submission",
        ),
        row(
            Get,
            SUBMISSIONS,
            None,
            E::None,
            200,
            E::Json,
            "WorkerApi::submissions",
        ),
        row(
            Get,
            SUBMISSION,
            None,
            E::None,
            200,
            E::Json,
            "WorkerApi::submission",
        ),
        row(
            Delete,
            SUBMISSION,
            None,
            E::None,
            200,
            E::Json,
            "WorkerApi::cancel_submission",
        ),
        row(
            Get,
            SUBMISSION_RESULTS,
            Some("ResultsQuery"),
            E::None,
            200,
            E::Postcard,
            "WorkerApi::submission_results",
        ),
        row(
            Get,
            HISTORY,
            Some("HistoryQuery"),
            E::None,
            200,
            E::Json,
            "WorkerApi::history",
        ),
        row(
            Post,
            BACKLOG,
            None,
            E::Postcard,
            204,
            E::None,
            "WorkerApi::post_backlog",
        ),
        row(
            Post,
            GOSSIP,
            None,
            E::Postcard,
            200,
            E::Postcard,
            "gossip::HttpTransport",
        ),
        row(
            Get,
            PEERS,
            None,
            E::None,
            200,
            E::PostcardOrJson,
            "WorkerApi::peers",
        ),
        row(
            Get,
            CONTROLLER,
            None,
            E::None,
            200,
            E::Json,
            "peerwasm status",
        ),
        row(Get, METRICS, None, E::None, 200, E::Text, "Prometheus"),
        row(Get, STATUS_PAGE, None, E::None, 200, E::Text, "a browser"),
    ]
};

/// The row of `method` on the route `path` matches (a filled-in path, any
/// query ignored), if any.
pub fn find(method: Method, path: &str) -> Option<&'static Route> {
    let path = path.split('?').next().unwrap_or_default();
    TABLE
        .iter()
        .find(|r| r.method == method && matches(r.path, path))
}

/// Whether the filled-in `path` is `route` with its parameter (one path
/// segment) filled in.
pub fn matches(route: &str, path: &str) -> bool {
    let (a, b): (Vec<_>, Vec<_>) = (route.split('/').collect(), path.split('/').collect());
    a.len() == b.len()
        && a.iter()
            .zip(&b)
            .all(|(r, p)| r == p || (r.starts_with('{') && r.ends_with('}') && !p.is_empty()))
}

/// `POST /v1/jobs`'s query: `detach=true` starts the job and answers its id
/// (202) instead of its result.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PostJobQuery {
    #[serde(default)]
    pub detach: bool,
}

/// `GET /v1/jobs/{id}/output`'s query: how many bytes of each stream the
/// caller has already seen (the answer starts there).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputQuery {
    #[serde(default)]
    pub stdout: u64,
    #[serde(default)]
    pub stderr: u64,
}

/// `GET /v1/submissions/{id}/results`'s query: the first index wanted, and
/// how long to wait for it if it is not in yet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResultsQuery {
    #[serde(default)]
    pub from: u64,
    #[serde(default)]
    pub wait_ms: u64,
}

/// `GET /v1/history`'s query: jobs that ended since a time (ms since the
/// Unix epoch), of one tenant (an operator may name any).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryQuery {
    #[serde(default)]
    pub since_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

/// What `DELETE /v1/jobs/{id}` and `DELETE /v1/submissions/{id}` answer
/// when they cancelled something.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelAnswer {
    /// The job's or submission's id.
    pub id: String,
    /// What it was doing when cancelled: `queued`, `running`, or `done`
    /// (a kept result discarded).
    pub was: String,
}

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
        for Route {
            method,
            path: route,
            ..
        } in TABLE
        {
            assert!(
                seen.insert((method, route)),
                "{method:?} {route} listed twice"
            );
            assert!(
                route.starts_with("/v1/") || route == METRICS || route == STATUS_PAGE,
                "{route}"
            );
            assert!(route.matches('{').count() <= 1, "{route}");
        }
    }

    #[test]
    fn a_filled_in_path_finds_its_row_and_no_other() {
        let row = find(Method::Delete, &path(JOB, "j-1")).unwrap();
        assert_eq!((row.path, row.ok), (JOB, 200));
        assert_eq!(
            find(Method::Get, "/v1/jobs/j-1/output?stdout=3")
                .unwrap()
                .path,
            JOB_OUTPUT
        );
        assert!(find(Method::Put, JOBS).is_none(), "no PUT on /v1/jobs");
        assert!(
            find(Method::Get, "/v1/jobs//output").is_none(),
            "an empty id"
        );
        assert!(find(Method::Get, "/v1/modules/a/b").is_none());
    }
}
