//! Groups the jobs bound for one worker into batches (`POST /v1/jobs/batch`,
//! format in [`crate::proto::batch`]), so that a map of many short jobs
//! does not pay for one HTTP exchange per job.
//!
//! The rule is Nagle's: a job for a worker that has few of our jobs goes out
//! at once, alone or with whatever else is already waiting — no added
//! latency. Only while the worker already holds at least two jobs of ours
//! per slot (so a new job would wait in its queue anyway) does the batcher
//! linger up to [`LINGER`] to gather more. Answers come back one frame per
//! job, as each ends, so a batch never makes a short job wait for a long one.

use crate::net::HttpClient;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::api::{ApiError, WorkerApi};
use super::errors::PeerError;
use crate::proto::batch::{BatchAnswer, FrameReader, MAX_BATCH_JOBS};

/// How long a batch may wait for company while the worker is busy.
pub const LINGER: Duration = Duration::from_millis(1);

/// How often a batch under way checks whether anyone still waits for it.
const ABANDON_CHECK: Duration = Duration::from_millis(50);

/// The most jobs a client puts in one batch.
const BATCH_JOBS: usize = 512;

/// The most bytes of specs (inputs included) a client puts in one batch,
/// unless one job alone is more: a worker charges a body to its memory
/// before it holds it, and a body that does not fit beside its jobs is
/// refused — a refusal of a few MiB costs a retry, one of hundreds a lost
/// connection mid-body and every job of it sent again.
const BATCH_BYTES: usize = 4 << 20;
const _: () = assert!(BATCH_JOBS <= MAX_BATCH_JOBS);

/// One job waiting to be sent: its postcard `JobSpec`, and who wants the answer.
struct Waiting {
    spec: bytes::Bytes,
    reply: oneshot::Sender<Result<BatchAnswer, PeerError>>,
}

/// A worker's batcher: the queue its sending task reads.
struct Lane {
    queue: mpsc::UnboundedSender<Waiting>,
    /// Our jobs sent to it and not yet answered.
    outstanding: Arc<AtomicUsize>,
    /// Its slots, as last seen in the pool view.
    slots: Arc<AtomicUsize>,
}

/// The batchers of one client, one per worker.
pub(super) struct Batchers {
    lanes: Mutex<HashMap<String, Lane>>,
}

impl Batchers {
    pub(super) fn new() -> Batchers {
        Batchers {
            lanes: Mutex::new(HashMap::new()),
        }
    }

    /// Sends one job (its postcard `JobSpec`) to `addr`, which has `slots`
    /// slots, in the next batch; its answer. `Err` only when the exchange
    /// itself failed; refusals are answers. `http` is the client a new lane
    /// to `addr` sends with (whether it carries the token is the pool's
    /// decision).
    pub(super) async fn submit(
        &self,
        addr: &str,
        slots: u32,
        spec: bytes::Bytes,
        http: &HttpClient,
    ) -> Result<BatchAnswer, PeerError> {
        let (reply, answer) = oneshot::channel();
        {
            let mut lanes = self.lanes.lock();
            let lane = lanes
                .entry(addr.to_string())
                .or_insert_with(|| open(addr, http));
            lane.slots.store(slots.max(1) as usize, Ordering::Relaxed);
            if let Err(mpsc::error::SendError(w)) = lane.queue.send(Waiting { spec, reply }) {
                // Cannot happen while the lane exists (its task lives as long
                // as the sender); answer rather than hang if it does.
                let _ = w
                    .reply
                    .send(Err(PeerError::Lost("the batcher stopped".into())));
            }
        }
        answer
            .await
            .unwrap_or_else(|_| Err(PeerError::Lost("the batch was dropped".into())))
    }
}

/// A lane to `addr`, sending with `http`.
fn open(addr: &str, http: &HttpClient) -> Lane {
    let (queue, rx) = mpsc::unbounded_channel();
    let lane = Lane {
        queue,
        outstanding: Arc::new(AtomicUsize::new(0)),
        slots: Arc::new(AtomicUsize::new(1)),
    };
    let (http, addr, outstanding) = (http.clone(), addr.to_string(), lane.outstanding.clone());
    let dispatch = move |batch| {
        tokio::spawn(send(http.clone(), addr.clone(), batch, outstanding.clone()));
    };
    tokio::spawn(gather(
        rx,
        lane.outstanding.clone(),
        lane.slots.clone(),
        dispatch,
    ));
    lane
}

/// The lane's task: takes jobs as they come, forms batches, and hands
/// each to `dispatch` (which sends it in a task of its own: several
/// batches may be under way at once), counting its jobs as outstanding.
async fn gather(
    mut rx: mpsc::UnboundedReceiver<Waiting>,
    outstanding: Arc<AtomicUsize>,
    slots: Arc<AtomicUsize>,
    mut dispatch: impl FnMut(Vec<Waiting>),
) {
    // A job that would take its batch past `BATCH_BYTES` starts the next.
    let mut carried: Option<Waiting> = None;
    loop {
        let first = match carried.take() {
            Some(w) => w,
            None => match rx.recv().await {
                Some(w) => w,
                None => break,
            },
        };
        let mut bytes = first.spec.len();
        let mut batch = vec![first];
        let mut add = |w: Waiting, batch: &mut Vec<Waiting>| -> Option<Waiting> {
            if bytes + w.spec.len() > BATCH_BYTES {
                return Some(w);
            }
            bytes += w.spec.len();
            batch.push(w);
            None
        };
        while batch.len() < BATCH_JOBS && carried.is_none() {
            match rx.try_recv() {
                Ok(w) => carried = add(w, &mut batch),
                Err(_) => break,
            }
        }
        if carried.is_none()
            && outstanding.load(Ordering::Relaxed) >= 2 * slots.load(Ordering::Relaxed)
        {
            let deadline = tokio::time::Instant::now() + LINGER;
            while batch.len() < BATCH_JOBS && carried.is_none() {
                match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Ok(Some(w)) => carried = add(w, &mut batch),
                    Ok(None) | Err(_) => break,
                }
            }
        }
        outstanding.fetch_add(batch.len(), Ordering::Relaxed);
        dispatch(batch);
    }
}

/// Sends one batch and hands each answer to its job as its frame arrives.
async fn send(http: HttpClient, addr: String, batch: Vec<Waiting>, outstanding: Arc<AtomicUsize>) {
    let body = batch_body(batch.iter().map(|w| &w.spec[..]));
    let count = batch.len();
    let waiting: Mutex<Vec<Option<oneshot::Sender<_>>>> =
        Mutex::new(batch.into_iter().map(|w| Some(w.reply)).collect());
    let lock = || waiting.lock();
    let mut answer = |index: usize, a: Result<BatchAnswer, PeerError>| {
        if let Some(reply) = lock().get_mut(index).and_then(Option::take) {
            outstanding.fetch_sub(1, Ordering::Relaxed);
            let _ = reply.send(a);
        }
    };
    // When every job still unanswered has lost its waiter (a map that was
    // interrupted or stopped, a `run` cancelled with Ctrl-C), hang up: the
    // worker then cancels the batch's jobs instead of running them for
    // nobody.
    let abandoned = async {
        loop {
            tokio::time::sleep(ABANDON_CHECK).await;
            if lock().iter().flatten().all(|reply| reply.is_closed()) {
                return;
            }
        }
    };
    let ended = tokio::select! {
        ended = exchange(WorkerApi::new(&http, &addr), body, count, &mut answer) => ended,
        () = abandoned => Err(PeerError::Lost("nobody waits for the batch any more".into())),
    };
    // Whatever was not answered shares the exchange's fate.
    let why = match ended {
        Ok(()) => PeerError::Lost("the worker's answer ended before every job of the batch".into()),
        Err(e) => e,
    };
    for index in 0..count {
        answer(index, Err(why.clone()));
    }
}

/// The body of a batch: a postcard `Vec<JobSpec>` made of specs already
/// encoded — its length (a varint, as postcard writes any integer), then
/// the elements as they are.
fn batch_body<'a>(specs: impl ExactSizeIterator<Item = &'a [u8]> + Clone) -> Vec<u8> {
    let mut body = Vec::with_capacity(5 + specs.clone().map(<[u8]>::len).sum::<usize>());
    body.extend(postcard::to_allocvec(&specs.len()).expect("a length encodes"));
    for spec in specs {
        body.extend_from_slice(spec);
    }
    body
}

/// The HTTP exchange of one batch; calls `answer` for each job answered.
async fn exchange(
    api: WorkerApi<'_>,
    body: Vec<u8>,
    count: usize,
    answer: &mut impl FnMut(usize, Result<BatchAnswer, PeerError>),
) -> Result<(), PeerError> {
    let mut resp = match api.post_batch(body.into()).await {
        Ok(resp) => resp,
        Err(ApiError::Status {
            status,
            message,
            largest,
        }) => {
            // The whole request was refused: every job gets that refusal.
            for index in 0..count {
                let refused = BatchAnswer::Refused {
                    status: status.as_u16(),
                    message: message.clone(),
                    largest_job: largest,
                };
                answer(index, Ok(refused));
            }
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    let mut reader = FrameReader::default();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| PeerError::from_reqwest(&e))?
    {
        reader.push(&chunk);
        while let Some(item) = reader.next_item().map_err(PeerError::Lost)? {
            answer(item.index as usize, Ok(item.answer));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! The batching rule on tokio's paused clock, with a fake dispatch.

    use super::*;
    use crate::proto::{JobSpec, ModuleHash};

    fn waiting(n: u8) -> (Waiting, oneshot::Receiver<Result<BatchAnswer, PeerError>>) {
        let (reply, rx) = oneshot::channel();
        (
            Waiting {
                spec: bytes::Bytes::from(vec![n]),
                reply,
            },
            rx,
        )
    }

    /// What a lane sent, and when.
    type SentLog = Arc<Mutex<Vec<(Vec<u8>, tokio::time::Instant)>>>;

    /// A lane whose batches are recorded (their jobs' first bytes, and
    /// when) instead of sent; `outstanding` jobs already on the worker.
    fn lane(slots: usize, outstanding: usize) -> (mpsc::UnboundedSender<Waiting>, SentLog) {
        let (tx, rx) = mpsc::unbounded_channel();
        let sent = Arc::new(Mutex::new(Vec::new()));
        let record = sent.clone();
        let dispatch = move |batch: Vec<Waiting>| {
            record.lock().push((
                batch.iter().map(|w| w.spec[0]).collect(),
                tokio::time::Instant::now(),
            ));
        };
        tokio::spawn(gather(
            rx,
            Arc::new(AtomicUsize::new(outstanding)),
            Arc::new(AtomicUsize::new(slots)),
            dispatch,
        ));
        (tx, sent)
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_stops_short_of_its_byte_cap_and_the_next_job_starts_the_next() {
        let (tx, sent) = lane(64, 0);
        let big = |n: u8| {
            let (reply, rx) = oneshot::channel();
            let spec = bytes::Bytes::from(vec![n; 3 << 20]);
            (Waiting { spec, reply }, rx)
        };
        let (jobs, _replies): (Vec<_>, Vec<_>) =
            [big(1), big(2), big(3), waiting(4)].into_iter().unzip();
        for job in jobs {
            tx.send(job).unwrap();
        }
        tokio::task::yield_now().await;
        let sent: Vec<Vec<u8>> = sent.lock().iter().map(|(jobs, _)| jobs.clone()).collect();
        assert_eq!(
            sent,
            [vec![1], vec![2], vec![3, 4]],
            "3 + 3 MiB is over the 4 MiB cap"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_job_for_a_worker_with_room_goes_at_once_with_whatever_already_waits() {
        let (tx, sent) = lane(2, 0);
        let start = tokio::time::Instant::now();
        let (a, _ra) = waiting(1);
        tx.send(a).unwrap();
        tokio::task::yield_now().await;
        let (b, _rb) = waiting(2);
        let (c, _rc) = waiting(3);
        tx.send(b).unwrap();
        tx.send(c).unwrap();
        tokio::task::yield_now().await;
        let sent = sent.lock().clone();
        assert_eq!(
            sent.iter()
                .map(|(jobs, _)| jobs.clone())
                .collect::<Vec<_>>(),
            [vec![1], vec![2, 3]]
        );
        assert!(
            sent.iter().all(|(_, at)| *at == start),
            "no lingering while the worker has room"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_busy_worker_gets_the_jobs_of_one_linger_in_one_batch() {
        // Two jobs per slot already there: a new one would queue anyway.
        let (tx, sent) = lane(1, 2);
        let start = tokio::time::Instant::now();
        let (a, _ra) = waiting(1);
        tx.send(a).unwrap();
        tokio::time::sleep(LINGER / 2).await;
        let (b, _rb) = waiting(2);
        tx.send(b).unwrap();
        tokio::time::sleep(LINGER).await;
        let (c, _rc) = waiting(3);
        tx.send(c).unwrap();
        tokio::time::sleep(2 * LINGER).await;
        let sent = sent.lock().clone();
        assert_eq!(
            sent.iter()
                .map(|(jobs, _)| jobs.clone())
                .collect::<Vec<_>>(),
            [vec![1, 2], vec![3]]
        );
        assert_eq!(
            sent[0].1 - start,
            LINGER,
            "the first batch waited exactly its linger"
        );
    }

    #[test]
    fn a_batch_body_is_the_postcard_list_of_its_specs() {
        let specs: Vec<JobSpec> = (0..3u8)
            .map(|i| JobSpec {
                args: vec![i.to_string()],
                ..JobSpec::new(ModuleHash([i; 32]))
            })
            .collect();
        let encoded: Vec<Vec<u8>> = specs
            .iter()
            .map(|s| postcard::to_allocvec(s).unwrap())
            .collect();
        let body = batch_body(encoded.iter().map(Vec::as_slice));
        assert_eq!(body, postcard::to_allocvec(&specs).unwrap());
        assert_eq!(postcard::from_bytes::<Vec<JobSpec>>(&body).unwrap(), specs);
    }
}
