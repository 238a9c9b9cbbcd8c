//! The worker's HTTP API as a client calls it: [`WorkerApi`], one method
//! per route of [`proto::routes`](crate::proto::routes), each building its
//! request (path, content type, body encoding) and reading its answer into
//! the route's type. What an answer *means* — whom to ask next, when to
//! retry or upload, what a refusal says about placement — stays with the
//! callers (`Pool`, `jobs`, `submit`, `detach`): policy above, wire here.
//! The worker's side of each route is `server`'s router, built from the
//! same route constants.
//!
//! A job's own routes (`POST /v1/jobs`, `/batch`, `/stream`) answer with a
//! body the caller reads as it comes (frames, a result); their methods
//! return the response once its status is the route's success.

use std::time::Duration;

use bytes::Bytes;
use reqwest::{RequestBuilder, Response, StatusCode};

use crate::gossip::PeerView;
use crate::net::HttpClient;
use crate::proto::submission::{HistoryRecord, ResultsPage, SubmissionInfo};
use crate::proto::tree::FileHash;
use crate::proto::{
    JobOutput, JobStatus, LARGEST_JOB_HEADER, ModuleHash, POSTCARD, PROTOCOL_HEADER,
    PROTOCOL_VERSION, routes,
};

/// How long a worker may take to answer for its pool view.
pub const PEERS_TIMEOUT: Duration = Duration::from_secs(5);

/// What went wrong in one exchange with one worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApiError {
    /// No answer: the connection failed (`connect`: before anything was
    /// sent) or broke; said in words (`net::describe`).
    Transport { connect: bool, why: String },
    /// The worker answered another status than the route's success, with
    /// its message and, for a job it could never hold, the largest it
    /// could.
    Status {
        status: StatusCode,
        message: String,
        largest: Option<u64>,
    },
    /// The answer could not be read as the route's type.
    Unreadable(String),
}

impl ApiError {
    fn from_reqwest(e: &reqwest::Error) -> ApiError {
        ApiError::Transport {
            connect: e.is_connect(),
            why: crate::net::describe(e),
        }
    }

    /// The status the worker answered, if it answered.
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            ApiError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApiError::Transport { why, .. } => f.write_str(why),
            ApiError::Status {
                status, message, ..
            } => write!(f, "{status} {message}"),
            ApiError::Unreadable(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for ApiError {}

/// An HTTP client for talking to workers on `transport`: our protocol
/// version and, if given, the tenant's token on every request.
pub fn http_client(
    token: Option<&str>,
    transport: &crate::net::Transport,
) -> anyhow::Result<HttpClient> {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(
        PROTOCOL_HEADER,
        reqwest::header::HeaderValue::from_static(PROTOCOL_VERSION),
    );
    let builder = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true);
    transport.client(builder, headers, token)
}

/// The requests that carry a tenant's job, which a worker may answer by
/// asking for its module or trees first (`Pool::post_providing`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobPost {
    /// `POST /v1/jobs`: run it, answer its result.
    Attached,
    /// `POST /v1/jobs?detach=true`: start it, answer its id.
    Detached,
    /// `POST /v1/submissions`: own the map, answer it stored.
    Submission,
}

/// One worker's API, through `http` (which carries the token, if any, and
/// chooses the scheme).
#[derive(Clone, Copy)]
pub struct WorkerApi<'a> {
    http: &'a HttpClient,
    addr: &'a str,
}

impl<'a> WorkerApi<'a> {
    /// The worker at `addr` (`host:port`), reached with `http`.
    pub fn new(http: &'a HttpClient, addr: &'a str) -> WorkerApi<'a> {
        WorkerApi { http, addr }
    }

    /// The worker's address.
    pub fn addr(&self) -> &'a str {
        self.addr
    }

    fn url(&self, path: &str) -> String {
        self.http.url(self.addr, path)
    }

    /// Sends `request` (over the network, or to an in-memory exchange: the
    /// client's transport says).
    async fn send(&self, request: RequestBuilder) -> Result<Response, ApiError> {
        self.http
            .send(request)
            .await
            .map_err(|e| ApiError::Transport {
                connect: e.connect,
                why: e.why,
            })
    }

    /// Sends `request`; its response if the status is `ok`.
    async fn expect(&self, request: RequestBuilder, ok: StatusCode) -> Result<Response, ApiError> {
        let resp = self.send(request).await?;
        if resp.status() == ok {
            return Ok(resp);
        }
        let status = resp.status();
        let largest = resp
            .headers()
            .get(LARGEST_JOB_HEADER)
            .and_then(|v| v.to_str().ok()?.parse().ok());
        let message = resp.text().await.unwrap_or_default().trim().to_string();
        Err(ApiError::Status {
            status,
            message,
            largest,
        })
    }

    async fn body(resp: Response) -> Result<Bytes, ApiError> {
        resp.bytes().await.map_err(|e| ApiError::from_reqwest(&e))
    }

    async fn postcard<T: serde::de::DeserializeOwned>(
        &self,
        resp: Response,
        what: &str,
    ) -> Result<T, ApiError> {
        let bytes = Self::body(resp).await?;
        postcard::from_bytes(&bytes).map_err(|e| {
            ApiError::Unreadable(format!("{} sent {what} we cannot read: {e}", self.addr))
        })
    }

    async fn json<T: serde::de::DeserializeOwned>(
        &self,
        resp: Response,
        what: &str,
    ) -> Result<T, ApiError> {
        let bytes = Self::body(resp).await?;
        serde_json::from_slice(&bytes).map_err(|e| {
            ApiError::Unreadable(format!("{} sent {what} we cannot read: {e}", self.addr))
        })
    }

    /// `GET /v1/peers`: the pool as this worker sees it.
    pub async fn peers(&self) -> Result<Vec<PeerView>, ApiError> {
        let request = self
            .http
            .get(self.url(routes::PEERS))
            .header(reqwest::header::ACCEPT, POSTCARD)
            // A worker answers its view at once; one that accepts and never
            // answers (stopped, a laptop closed) must not hold a map's view
            // forever: the next seed is asked.
            .timeout(PEERS_TIMEOUT);
        let resp = self.expect(request, StatusCode::OK).await?;
        self.postcard(resp, "a pool view").await
    }

    /// `PUT /v1/modules/{hash}`: a module's bytes.
    pub async fn put_module(&self, hash: &ModuleHash, bytes: Bytes) -> Result<(), ApiError> {
        let request = self
            .http
            .put(self.url(&routes::path(routes::MODULE, &hash.to_hex())))
            .header(reqwest::header::CONTENT_TYPE, "application/wasm")
            .body(bytes);
        let resp = self.send(request).await?;
        match resp.status() {
            s if s.is_success() => Ok(()),
            status => Err(ApiError::Status {
                status,
                message: resp.text().await.unwrap_or_default().trim().to_string(),
                largest: None,
            }),
        }
    }

    /// `PUT /v1/trees/{hash}`: a shipped directory's manifest (as encoded);
    /// the files the worker lacks.
    pub async fn put_tree(
        &self,
        manifest: &ModuleHash,
        encoded: Bytes,
    ) -> Result<Vec<FileHash>, ApiError> {
        let request = self
            .http
            .put(self.url(&routes::path(routes::TREE, &manifest.to_hex())))
            .header(reqwest::header::CONTENT_TYPE, POSTCARD)
            .body(encoded);
        let resp = self.expect_success(request).await?;
        self.postcard(resp, "an answer to a tree").await
    }

    /// `PUT /v1/files/{hash}`: one file of a shipped directory, streamed.
    pub async fn put_file(&self, hash: &FileHash, body: reqwest::Body) -> Result<(), ApiError> {
        let request = self
            .http
            .put(self.url(&routes::path(routes::FILE, &hash.to_hex())))
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
            .body(body);
        self.expect_success(request).await.map(drop)
    }

    /// Sends `request`; its response if the status is a success (2xx).
    async fn expect_success(&self, request: RequestBuilder) -> Result<Response, ApiError> {
        let resp = self.send(request).await?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status();
        Err(ApiError::Status {
            status,
            message: resp.text().await.unwrap_or_default().trim().to_string(),
            largest: None,
        })
    }

    /// `POST /v1/jobs`: a job (a postcard `JobSpec`); the response once its
    /// status is 200 (its result follows) or, `detach`ed, 202 (its id).
    pub async fn post_job(&self, body: Bytes, detach: bool) -> Result<Response, ApiError> {
        let request = self
            .http
            .post(self.url(routes::JOBS))
            .query(&routes::PostJobQuery { detach })
            .header(reqwest::header::CONTENT_TYPE, POSTCARD)
            .body(body);
        let accepted = match detach {
            true => StatusCode::ACCEPTED,
            false => StatusCode::OK,
        };
        self.expect(request, accepted).await
    }

    /// One of the requests that carry a tenant's job, with `body`.
    pub async fn post_carrying(&self, what: JobPost, body: Bytes) -> Result<Response, ApiError> {
        match what {
            JobPost::Attached => self.post_job(body, false).await,
            JobPost::Detached => self.post_job(body, true).await,
            JobPost::Submission => self.post_submission(body).await,
        }
    }

    /// `POST /v1/submissions`: a map (a postcard `SubmissionSpec`) for this
    /// worker to own; the response once it is stored (201).
    pub async fn post_submission(&self, body: Bytes) -> Result<Response, ApiError> {
        let request = self
            .http
            .post(self.url(routes::SUBMISSIONS))
            .header(reqwest::header::CONTENT_TYPE, POSTCARD)
            .body(body);
        self.expect(request, StatusCode::CREATED).await
    }

    /// `POST /v1/backlog`: what a running map still has to run.
    pub async fn post_backlog(
        &self,
        backlog: &crate::proto::backlog::Backlog,
    ) -> Result<(), ApiError> {
        let body =
            postcard::to_allocvec(backlog).map_err(|e| ApiError::Unreadable(e.to_string()))?;
        let request = self
            .http
            .post(self.url(routes::BACKLOG))
            .header(reqwest::header::CONTENT_TYPE, POSTCARD)
            .body(body);
        self.expect(request, StatusCode::NO_CONTENT).await.map(drop)
    }

    /// `POST /v1/jobs/batch`: many jobs; the response streams their
    /// answers (frames) as they end.
    pub async fn post_batch(&self, body: Bytes) -> Result<Response, ApiError> {
        let request = self
            .http
            .post(self.url(routes::BATCH))
            .header(reqwest::header::CONTENT_TYPE, POSTCARD)
            .body(body);
        self.expect(request, StatusCode::OK).await
    }

    /// `POST /v1/jobs/stream`: one job whose stdin is `body` as it comes;
    /// the response streams its output (frames).
    pub async fn post_stream(&self, body: reqwest::Body) -> Result<Response, ApiError> {
        let request = self
            .http
            .post(self.url(routes::STREAM))
            .header(reqwest::header::CONTENT_TYPE, POSTCARD)
            .body(body);
        self.expect(request, StatusCode::OK).await
    }

    /// `GET /v1/jobs`: the caller's jobs here.
    pub async fn jobs(&self) -> Result<Vec<JobStatus>, ApiError> {
        let resp = self
            .expect(self.http.get(self.url(routes::JOBS)), StatusCode::OK)
            .await?;
        self.json(resp, "a list").await
    }

    /// `DELETE /v1/jobs/{id}`: cancels a job; what it was (`queued`,
    /// `running`, `done`). 409: it had ended; 404: not here.
    pub async fn cancel_job(&self, id: &str) -> Result<String, ApiError> {
        let resp = self
            .expect(
                self.http.delete(self.url(&routes::path(routes::JOB, id))),
                StatusCode::OK,
            )
            .await?;
        let answer: routes::CancelAnswer = self.json(resp, "an answer to a cancel").await?;
        Ok(answer.was)
    }

    /// `GET /v1/jobs/{id}/output`: a detached job's output past `seen`
    /// bytes of stdout and stderr, and its outcome once it has ended.
    pub async fn job_output(&self, id: &str, seen: [u64; 2]) -> Result<JobOutput, ApiError> {
        let request = self
            .http
            .get(self.url(&routes::path(routes::JOB_OUTPUT, id)))
            .query(&routes::OutputQuery {
                stdout: seen[0],
                stderr: seen[1],
            });
        let resp = self.expect(request, StatusCode::OK).await?;
        self.postcard(resp, "output").await
    }

    /// `GET /v1/submissions/{id}`: a submission's owner and progress.
    pub async fn submission(&self, id: &str) -> Result<SubmissionInfo, ApiError> {
        let resp = self
            .expect(
                self.http
                    .get(self.url(&routes::path(routes::SUBMISSION, id))),
                StatusCode::OK,
            )
            .await?;
        self.json(resp, "a submission").await
    }

    /// `GET /v1/submissions/{id}/results`: results from input `from` on,
    /// the worker waiting up to `wait` for the next one.
    pub async fn submission_results(
        &self,
        id: &str,
        from: u64,
        wait: Duration,
    ) -> Result<ResultsPage, ApiError> {
        let request = self
            .http
            .get(self.url(&routes::path(routes::SUBMISSION_RESULTS, id)))
            .query(&routes::ResultsQuery {
                from,
                wait_ms: wait.as_millis() as u64,
            })
            .timeout(wait + Duration::from_secs(30));
        let resp = self.expect(request, StatusCode::OK).await?;
        self.postcard(resp, "results").await
    }

    /// `GET /v1/submissions`: the caller's submissions owned here.
    pub async fn submissions(&self) -> Result<Vec<SubmissionInfo>, ApiError> {
        let resp = self
            .expect(self.http.get(self.url(routes::SUBMISSIONS)), StatusCode::OK)
            .await?;
        self.json(resp, "a list").await
    }

    /// `GET /v1/history`: the jobs this worker ran since `since_ms` (only
    /// `tenant`'s when given).
    pub async fn history(
        &self,
        since_ms: u64,
        tenant: Option<&str>,
    ) -> Result<Vec<HistoryRecord>, ApiError> {
        let query = routes::HistoryQuery {
            since_ms,
            tenant: tenant.map(String::from),
        };
        let request = self.http.get(self.url(routes::HISTORY)).query(&query);
        let resp = self.expect(request, StatusCode::OK).await?;
        self.json(resp, "a list").await
    }

    /// `DELETE /v1/submissions/{id}`: cancels (or discards) a submission;
    /// what it was.
    pub async fn cancel_submission(&self, id: &str) -> Result<String, ApiError> {
        let request = self
            .http
            .delete(self.url(&routes::path(routes::SUBMISSION, id)));
        let resp = self.expect(request, StatusCode::OK).await?;
        let answer: routes::CancelAnswer = self.json(resp, "an answer to a cancel").await?;
        Ok(answer.was)
    }
}

#[cfg(test)]
mod tests {
    //! Every method of [`WorkerApi`] sends a request of the route table
    //! (`proto::routes::TABLE`): its method, its path, a query exactly when
    //! its row takes one, and the table names that method as the row's
    //! client — walked through an exchange that records what it is sent.

    use std::sync::Arc;

    use parking_lot::Mutex;

    use super::*;
    use crate::net::exchange::{Exchange, ExchangeFuture};
    use crate::proto::routes::{Method, TABLE};

    /// Records each request's method, path and query; answers 500.
    #[derive(Default)]
    struct Recorder(Mutex<Vec<(String, String, Option<String>)>>);

    impl Exchange for Recorder {
        fn exchange(&self, request: http::Request<reqwest::Body>) -> ExchangeFuture {
            let uri = request.uri();
            self.0.lock().push((
                request.method().to_string(),
                uri.path().to_string(),
                uri.query().map(String::from),
            ));
            Box::pin(async {
                Ok(http::Response::builder()
                    .status(500)
                    .body(reqwest::Body::from("recorded"))
                    .unwrap())
            })
        }
    }

    #[tokio::test]
    async fn every_method_sends_a_request_of_the_route_table() {
        let recorder = Arc::new(Recorder::default());
        let transport = crate::net::Transport::in_memory(recorder.clone());
        let http = crate::client::http_client(None, &transport).unwrap();
        let api = WorkerApi::new(&http, "127.0.0.1:9");
        let hash = ModuleHash::of(b"m");
        let calls: Vec<(&str, Result<(), ApiError>)> = vec![
            ("peers", api.peers().await.map(drop)),
            ("put_module", api.put_module(&hash, Bytes::new()).await),
            (
                "put_tree",
                api.put_tree(&hash, Bytes::new()).await.map(drop),
            ),
            (
                "put_file",
                api.put_file(&FileHash::of(b"f"), reqwest::Body::from(""))
                    .await,
            ),
            (
                "post_job",
                api.post_job(Bytes::new(), false).await.map(drop),
            ),
            ("post_job", api.post_job(Bytes::new(), true).await.map(drop)),
            (
                "post_submission",
                api.post_submission(Bytes::new()).await.map(drop),
            ),
            ("post_backlog", api.post_backlog(&Default::default()).await),
            ("post_batch", api.post_batch(Bytes::new()).await.map(drop)),
            (
                "post_stream",
                api.post_stream(reqwest::Body::from("")).await.map(drop),
            ),
            ("jobs", api.jobs().await.map(drop)),
            ("cancel_job", api.cancel_job("j-1").await.map(drop)),
            ("job_output", api.job_output("j-1", [1, 2]).await.map(drop)),
            ("submission", api.submission("s-1").await.map(drop)),
            (
                "submission_results",
                api.submission_results("s-1", 3, Duration::ZERO)
                    .await
                    .map(drop),
            ),
            ("submissions", api.submissions().await.map(drop)),
            ("history", api.history(5, Some("a b&c")).await.map(drop)),
            (
                "cancel_submission",
                api.cancel_submission("s-1").await.map(drop),
            ),
        ];
        let sent = recorder.0.lock().clone();
        assert_eq!(sent.len(), calls.len(), "one request per call");
        for ((name, answer), (method, path, query)) in calls.iter().zip(&sent) {
            assert!(
                answer
                    .as_ref()
                    .is_err_and(|e| e.status() == Some(StatusCode::INTERNAL_SERVER_ERROR)),
                "{name}: the recorder's 500 comes back as a refusal: {answer:?}"
            );
            let method = [Method::Get, Method::Put, Method::Post, Method::Delete]
                .into_iter()
                .find(|m| m.as_str() == method)
                .unwrap();
            let row = routes::find(method, path)
                .unwrap_or_else(|| panic!("{name}: {method:?} {path} is not in the route table"));
            assert_eq!(
                row.client,
                format!("WorkerApi::{name}"),
                "{name}: {method:?} {path}"
            );
            assert_eq!(
                row.query.is_some(),
                query.is_some(),
                "{name}: query {query:?}"
            );
        }
        // The queries, as the server's extractors read them.
        let queries: Vec<_> = sent.iter().filter_map(|(_, _, q)| q.clone()).collect();
        assert_eq!(
            queries,
            [
                "detach=false",
                "detach=true",
                "stdout=1&stderr=2",
                "from=3&wait_ms=0",
                "since_ms=5&tenant=a+b%26c"
            ]
        );
        // And every row the table gives to `WorkerApi` was called.
        for row in TABLE.iter().filter(|r| r.client.starts_with("WorkerApi::")) {
            let name = row.client.trim_start_matches("WorkerApi::");
            assert!(
                calls.iter().any(|(n, _)| *n == name),
                "{} is not walked",
                row.client
            );
        }
    }
}
