//! Why a submission or one worker gave no result: [`SubmitError`] is what a
//! caller of the pool sees, `PeerError` what one worker's exchange ended in
//! (the pool turns it into the next candidate, a wait, or a `SubmitError`).

/// Why a submission produced no result.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// The job was on `peer` when the process running it died, or the
    /// peer was declared dead, or the connection broke and the peer no
    /// longer answers (`killed`); or the connection broke otherwise, or the
    /// worker shut down under it (not `killed`): it may or may not have
    /// run; submit it again. A map gives up on an input that was `killed`
    /// with it [`MapConfig::max_lost`](crate::client::MapConfig::max_lost)
    /// times (as Dask's `allowed-failures`).
    #[error("lost with worker {peer}: {reason}")]
    Lost {
        peer: String,
        reason: String,
        killed: bool,
    },
    /// No worker will ever run it as asked (too large for the pool, a bad
    /// request, no live worker for a long time).
    #[error("{0}")]
    Fatal(String),
}

/// Why one worker did not give a result.
#[derive(Clone, Debug)]
pub(crate) enum PeerError {
    /// Refused or too small: try the next one.
    Declined(String),
    /// Could not connect: nothing was sent.
    Unreachable(String),
    /// The connection broke after the job was sent.
    Lost(String),
    /// The request itself is wrong: no worker will take it.
    Fatal(String),
}

impl From<super::api::ApiError> for PeerError {
    /// An exchange that failed before the worker answered: unreachable if
    /// nothing was sent, else lost. A refusal (a status) means what its
    /// route says it means, which the caller decides; here it is lost.
    fn from(e: super::api::ApiError) -> PeerError {
        match e {
            super::api::ApiError::Transport { connect: true, why } => PeerError::Unreachable(why),
            other => PeerError::Lost(other.to_string()),
        }
    }
}

impl PeerError {
    /// A failed HTTP exchange: unreachable if nothing was sent, else lost.
    pub(crate) fn from_reqwest(e: &reqwest::Error) -> PeerError {
        if e.is_connect() {
            PeerError::Unreachable(crate::net::describe(e))
        } else {
            PeerError::Lost(crate::net::describe(e))
        }
    }
}

/// What a broken connection to a worker says about the job it carried.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Broken {
    /// The worker does not answer and another does, or another process of
    /// it answers on its address: the one that had the job is gone,
    /// perhaps ended by it. Counted.
    WorkerGone,
    /// The worker still answers: only the connection was lost.
    WorkerAnswers,
    /// No worker answers: this client may be cut off from the pool.
    NobodyAnswers,
}

impl Broken {
    /// Whether a map counts the loss against the input's `max_lost`.
    pub(crate) fn counts(&self) -> bool {
        *self == Broken::WorkerGone
    }

    /// What to add to the loss's reason, in words.
    pub(crate) fn said(&self) -> &'static str {
        match self {
            Broken::WorkerGone => "",
            Broken::WorkerAnswers => {
                " (the worker still answers: the connection was lost, not its process)"
            }
            Broken::NobodyAnswers => {
                " (no worker answers: this client may be cut off from the pool)"
            }
        }
    }
}
