//! The worker's API contract, run over both exchanges: a worker served in
//! memory ([`super::memory`]) and the same worker served on a real socket
//! by [`super::start`] — each contract is one `async fn` over a [`Served`]
//! worker, and [`contract!`] makes a test of it for each exchange. What
//! passes in memory and fails over HTTP (or the other way round) is the
//! seam drifting; what fails in both is the worker.
//!
//! The guests are WAT (`server::testing`: they compile in milliseconds).

use std::time::Duration;

use crate::client::http_client;
use crate::client::{ApiError, Pool, PoolConfig, Target, WorkerApi};
use crate::net::{HttpClient, Transport};
use crate::proto::submission::{SubmissionState, SubmitConfig};
use crate::proto::{LARGEST_JOB_HEADER, routes};

use super::memory::{MemoryNetwork, MemoryWorker};
use super::testing::{ECHO, MIB, SPIN, config, job, until};

/// Which exchange a contract runs over.
#[derive(Clone, Copy, Debug)]
pub(super) enum Exchange {
    InMemory,
    Http,
}

/// A worker under test, served over one exchange.
pub(super) struct Served {
    pub addr: String,
    pub transport: Transport,
    _worker: Box<dyn std::any::Any + Send>,
    _stop: Option<tokio::sync::oneshot::Sender<()>>,
    _dir: tempfile::TempDir,
}

impl Served {
    pub async fn start(exchange: Exchange, multi: bool) -> Served {
        let dir = tempfile::tempdir().unwrap();
        let config = config(dir.path(), multi);
        match exchange {
            Exchange::InMemory => {
                let network = MemoryNetwork::new();
                let worker = MemoryWorker::start(config, &network).await.unwrap();
                Served {
                    addr: worker.addr.clone(),
                    transport: network.transport(),
                    _worker: Box::new(worker),
                    _stop: None,
                    _dir: dir,
                }
            }
            Exchange::Http => {
                let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
                let running = super::start(config, async move {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
                Served {
                    addr: running.advertised.clone(),
                    transport: Transport::plain(),
                    _worker: Box::new(running),
                    _stop: Some(stop),
                    _dir: dir,
                }
            }
        }
    }

    /// A client of this exchange, sending `token`.
    pub fn http(&self, token: Option<&str>) -> HttpClient {
        http_client(token, &self.transport).unwrap()
    }

    /// The pool of this one worker, for the tenant of `token`.
    pub fn target(&self, token: Option<&str>) -> Target {
        let pool = Pool::new(PoolConfig {
            token: token.map(String::from),
            transport: self.transport.clone(),
            ..PoolConfig::new(vec![self.addr.clone()])
        })
        .unwrap();
        Target::Pool(std::sync::Arc::new(pool))
    }
}

/// A test of `$contract` over each exchange: `$name::in_memory` and
/// `$name::over_http`. `multi`: the worker has tenants (`alice`, `bob`).
macro_rules! contract {
    ($name:ident, $multi:expr) => {
        mod $name {
            use super::*;
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn in_memory() {
                super::$name(Served::start(Exchange::InMemory, $multi).await).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn over_http() {
                super::$name(Served::start(Exchange::Http, $multi).await).await
            }
        }
    };
}

contract!(a_job_runs_and_its_output_and_peak_come_back, false);
async fn a_job_runs_and_its_output_and_peak_come_back(w: Served) {
    let target = w.target(None);
    let echo = job(ECHO);
    let result = target
        .run(&echo, echo.spec(b"hello there".to_vec(), 8 * MIB))
        .await
        .unwrap();
    assert!(result.outcome.is_success(), "{}", result.outcome);
    assert_eq!(result.stdout, b"hello there");
    assert_eq!(result.peak_memory_bytes, 64 << 10, "one wasm page");
    assert_eq!(result.memory_limit_bytes, 8 * MIB);
}

contract!(a_map_comes_back_whole_and_in_order, false);
async fn a_map_comes_back_whole_and_in_order(w: Served) {
    let target = w.target(None);
    let inputs: Vec<Vec<u8>> = (0..40).map(|i| format!("input {i}").into_bytes()).collect();
    let mut items = Vec::new();
    let config = crate::client::MapConfig {
        estimates: None,
        mem: Some((4 * MIB).into()),
        ..Default::default()
    };
    crate::client::map(&target, &job(ECHO), inputs.clone(), &config, &mut items)
        .await
        .unwrap();
    let outputs: Vec<_> = items.iter().map(|i| i.result.stdout.clone()).collect();
    assert_eq!(outputs, inputs);
}

contract!(
    a_job_larger_than_the_worker_is_refused_naming_the_largest,
    false
);
async fn a_job_larger_than_the_worker_is_refused_naming_the_largest(w: Served) {
    let http = w.http(None);
    let api = WorkerApi::new(&http, &w.addr);
    let echo = job(ECHO);
    api.put_module(&echo.hash(), echo.bytes().to_vec().into())
        .await
        .unwrap();
    let spec = echo.spec(Vec::new(), 1 << 30);
    let body = postcard::to_allocvec(&spec).unwrap();
    let err = api.post_job(body.into(), false).await.unwrap_err();
    let ApiError::Status {
        status, largest, ..
    } = &err
    else {
        panic!("{err:?}")
    };
    assert!(status.is_client_error(), "{err}");
    let largest = largest.unwrap_or_else(|| panic!("no {LARGEST_JOB_HEADER} in {err}"));
    assert!(largest > 0 && largest <= 64 * MIB, "{largest}");
}

contract!(a_token_is_needed_and_a_tenant_sees_only_its_own, true);
async fn a_token_is_needed_and_a_tenant_sees_only_its_own(w: Served) {
    let echo = job(ECHO);
    let err = w
        .target(Some("mallory"))
        .run(&echo, echo.spec(b"x".to_vec(), 4 * MIB))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("token"), "{err}");
    // Alice detaches a job; Bob cannot see or cancel it.
    let (alice, bob) = (w.http(Some("alice")), w.http(Some("bob")));
    let pool = Pool::new(PoolConfig {
        token: Some("alice".into()),
        transport: w.transport.clone(),
        ..PoolConfig::new(vec![w.addr.clone()])
    })
    .unwrap();
    let spin = job(SPIN);
    let (addr, id) = pool
        .submit_detached(&spin, &spin.spec(Vec::new(), 4 * MIB))
        .await
        .unwrap();
    assert_eq!(addr, w.addr);
    let mine = WorkerApi::new(&alice, &w.addr).jobs().await.unwrap();
    assert!(mine.iter().any(|j| j.id == id), "{mine:?}");
    let theirs = WorkerApi::new(&bob, &w.addr).jobs().await.unwrap();
    assert!(theirs.iter().all(|j| j.id != id), "{theirs:?}");
    let refused = WorkerApi::new(&bob, &w.addr).cancel_job(&id).await;
    assert!(refused.is_err(), "{refused:?}");
    let was = WorkerApi::new(&alice, &w.addr)
        .cancel_job(&id)
        .await
        .unwrap();
    assert!(was == "running" || was == "queued", "{was}");
}

contract!(
    a_detached_job_s_output_is_read_from_where_it_was_seen,
    false
);
async fn a_detached_job_s_output_is_read_from_where_it_was_seen(w: Served) {
    let pool = Pool::new(PoolConfig {
        transport: w.transport.clone(),
        ..PoolConfig::new(vec![w.addr.clone()])
    })
    .unwrap();
    let echo = job(ECHO);
    let (_, id) = pool
        .submit_detached(&echo, &echo.spec(b"0123456789".to_vec(), 4 * MIB))
        .await
        .unwrap();
    let http = w.http(None);
    let api = WorkerApi::new(&http, &w.addr);
    until("the job ends", async || {
        api.job_output(&id, [0, 0]).await.unwrap().ended.is_some()
    })
    .await;
    let output = api.job_output(&id, [0, 0]).await.unwrap();
    assert_eq!(output.stdout, b"0123456789");
    let rest = api.job_output(&id, [4, 0]).await.unwrap();
    assert_eq!(rest.stdout, b"456789", "from the offset seen");
    let gone = api.job_output("j-no-such", [0, 0]).await.unwrap_err();
    assert_eq!(
        gone.status(),
        Some(reqwest::StatusCode::NOT_FOUND),
        "{gone}"
    );
}

contract!(a_submission_is_stored_run_and_its_results_read, false);
async fn a_submission_is_stored_run_and_its_results_read(w: Served) {
    let pool = Pool::new(PoolConfig {
        transport: w.transport.clone(),
        ..PoolConfig::new(vec![w.addr.clone()])
    })
    .unwrap();
    let echo = job(ECHO);
    let inputs: Vec<Vec<u8>> = (0..5).map(|i| vec![b'a' + i]).collect();
    let config = SubmitConfig {
        mem: Some((4 * MIB).into()),
        ..SubmitConfig::default()
    };
    let info = pool
        .submit_map(&echo, inputs.clone(), config, None)
        .await
        .unwrap();
    assert_eq!((info.owner.as_str(), info.total), (w.addr.as_str(), 5));
    let http = w.http(None);
    let api = WorkerApi::new(&http, &w.addr);
    let mut got = Vec::new();
    while got.len() < inputs.len() {
        let page = api
            .submission_results(&info.id, got.len() as u64, Duration::from_secs(10))
            .await
            .unwrap();
        assert!(
            !page.items.is_empty() || page.info.state == SubmissionState::Running,
            "{:?}",
            page.info
        );
        got.extend(page.items);
    }
    let outputs: Vec<_> = got.iter().map(|r| r.result.stdout.clone()).collect();
    assert_eq!(outputs, inputs);
    assert!(got.iter().enumerate().all(|(i, r)| r.index == i as u64));
    let listed = api.submissions().await.unwrap();
    assert!(listed.iter().any(|s| s.id == info.id), "{listed:?}");
    // Its state says so once its map has returned, a moment after its
    // last result is readable.
    until("the submission's map returns", async || {
        api.submission(&info.id).await.unwrap().state != SubmissionState::Running
    })
    .await;
    let done = api.submission(&info.id).await.unwrap();
    assert_eq!((done.done, done.state), (5, SubmissionState::Done));
    let history = api.history(0, None).await.unwrap();
    assert!(history.len() >= 5, "{history:?}");
    // A submission spec that is not one is refused, not stored.
    let junk = api.post_submission(vec![0xff; 9].into()).await.unwrap_err();
    assert!(junk.status().is_some_and(|s| s.is_client_error()), "{junk}");
}

contract!(the_pool_view_names_the_worker_and_its_backlog, false);
async fn the_pool_view_names_the_worker_and_its_backlog(w: Served) {
    use crate::proto::backlog::Backlog;
    let http = w.http(None);
    let api = WorkerApi::new(&http, &w.addr);
    let view = api.peers().await.unwrap();
    let me = view
        .iter()
        .find(|p| p.advert.addr == w.addr)
        .unwrap_or_else(|| panic!("{} not in {view:?}", w.addr));
    assert_eq!(me.advert.capacity_bytes, 64 * MIB);
    assert_eq!(me.advert.slots_total, 2);
    let backlog = Backlog {
        id: "m-1".into(),
        waiting: 7,
        memory_bytes: 3 * MIB,
        largest_bytes: 3 * MIB,
        job_ms: 500,
        ..Backlog::default()
    };
    api.post_backlog(&backlog).await.unwrap();
    let view = api.peers().await.unwrap();
    let me = view.iter().find(|p| p.advert.addr == w.addr).unwrap();
    assert_eq!(me.advert.backlog, vec![backlog], "the report, as sent");
    let forged = Backlog {
        id: String::new(),
        ..Backlog::default()
    };
    let refused = api.post_backlog(&forged).await.unwrap_err();
    assert!(
        refused.status().is_some_and(|s| s.is_client_error()),
        "{refused}"
    );
}

contract!(metrics_and_the_status_page_answer, false);
async fn metrics_and_the_status_page_answer(w: Served) {
    let http = w.http(None);
    for (route, accept, needle) in [
        (routes::METRICS, "*/*", "peerwasm_"),
        (routes::STATUS_PAGE, "text/html", "<html"),
        (routes::STATUS_PAGE, "*/*", "RESERVED/CAPACITY"),
    ] {
        let request = http
            .get(http.url(&w.addr, route))
            .header(reqwest::header::ACCEPT, accept);
        let resp = http.send(request).await.unwrap();
        assert_eq!(resp.status(), reqwest::StatusCode::OK, "{route}");
        let text = resp.text().await.unwrap();
        assert!(text.contains(needle), "{route} ({accept}): {text:.300}");
    }
    let resp = http
        .send(http.get(http.url(&w.addr, "/v1/no-such-route")))
        .await
        .unwrap();
    assert_eq!(resp.status(), reqwest::StatusCode::NOT_FOUND);
}

/// The router serves exactly [`routes::TABLE`]: each row's method and path
/// reach a handler (whatever it then says of the request), and every other
/// method on those paths is 405. In memory only: what is walked is the
/// router, not the exchange.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_router_serves_exactly_the_route_table() {
    use crate::proto::routes::{Method, TABLE};
    let w = Served::start(Exchange::InMemory, false).await;
    let http = w.http(None);
    let methods = [Method::Get, Method::Put, Method::Post, Method::Delete];
    for path in TABLE.iter().map(|r| r.path) {
        let filled = routes::path(path, "x");
        for method in methods {
            let listed = TABLE.iter().any(|r| r.path == path && r.method == method);
            let request = http
                .request(method.as_str().parse().unwrap(), http.url(&w.addr, &filled))
                .header(reqwest::header::CONTENT_TYPE, crate::proto::POSTCARD)
                .timeout(Duration::from_secs(5));
            let resp = http.send(request).await.unwrap();
            let status = resp.status();
            let body = resp.bytes().await.unwrap_or_default();
            let unmatched = status == reqwest::StatusCode::METHOD_NOT_ALLOWED
                || (status == reqwest::StatusCode::NOT_FOUND && body.is_empty());
            assert_eq!(
                !unmatched,
                listed,
                "{} {filled}: {status} {:?} (listed in the table: {listed})",
                method.as_str(),
                String::from_utf8_lossy(&body)
            );
        }
    }
}
