//! What the runtime tells its callers: why a term ended, its events, its errors.

use super::*;

/// Why a leader stepped down.
///
/// New variants may come in a minor release: a `match` needs a `_` arm.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StepDownReason {
    /// Renewal kept failing until the step-down time.
    RenewFailed,
    /// The store says the lease now belongs to someone else (or to nobody).
    Lost {
        /// The new holder, if the store named one.
        to: Option<Leader>,
    },
    /// An operator evicted this holder.
    Evicted,
    /// [`Leadership::resign`] was called.
    Resigned,
    /// The elector is shutting down.
    ShuttingDown,
    /// The process woke up (after a pause) past its local deadline.
    DeadlinePassed,
    /// Another announcing candidate should lead: one of higher priority, or the one a
    /// reservation names (`tenure evict --to`). The work stopped, then the lease was
    /// released for it (see [`Config::priority`]).
    HandedOver {
        /// The successor.
        to: HolderId,
    },
}

impl StepDownReason {
    /// A short name for the reason (`renew_failed`, `lost`, `evicted`, `resigned`,
    /// `shutting_down`, `deadline_passed`, `handed_over`), as metrics label it.
    pub fn name(&self) -> &'static str {
        match self {
            StepDownReason::RenewFailed => "renew_failed",
            StepDownReason::Lost { .. } => "lost",
            StepDownReason::Evicted => "evicted",
            StepDownReason::Resigned => "resigned",
            StepDownReason::ShuttingDown => "shutting_down",
            StepDownReason::DeadlinePassed => "deadline_passed",
            StepDownReason::HandedOver { .. } => "handed_over",
        }
    }
}

/// What an [`Elector`] tells its subscribers.
///
/// New variants may come in a minor release: a `match` needs a `_` arm.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// This candidate leads, with this token.
    Elected {
        /// The fencing token of the new term.
        token: crate::FencingToken,
    },
    /// This candidate stopped leading.
    SteppedDown {
        /// Why.
        reason: StepDownReason,
    },
    /// The leader as this candidate sees it changed; `None` means nobody leads.
    LeaderChanged(Option<Leader>),
}

/// Errors from building an [`Elector`].
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The election name or holder id was refused.
    #[error(transparent)]
    Name(#[from] NameError),
    /// A setting was refused.
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// Errors from waiting on an [`Elector`].
///
/// New variants may come in a minor release: a `match` needs a `_` arm.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ElectError {
    /// The elector was shut down (or dropped) before the wait ended.
    #[error("the elector has been shut down")]
    ShutDown,
    /// The store refused in a way no retry can mend (credentials, permissions, a bad
    /// configuration), so the elector stopped campaigning.
    #[error("the elector stopped: the store refused to work with it")]
    Store(#[source] Arc<StoreError>),
    /// The campaign task ended unexpectedly (a store implementation panicked).
    #[error("the elector's campaign task ended unexpectedly")]
    Crashed,
    /// The call does not go with this elector's settings (e.g. [`Elector::run_once`] with
    /// several holders); nothing was done.
    #[error("{0}")]
    Unsupported(String),
}

/// Errors from [`Leadership::set_metadata`].
#[derive(Debug, thiserror::Error)]
pub enum ProclaimError {
    /// The metadata is larger than [`MAX_METADATA`](crate::store::MAX_METADATA) bytes.
    #[error("metadata of {0} bytes is larger than the {max} bytes a lease holds", max = crate::store::MAX_METADATA)]
    TooLarge(usize),
    /// The term ended before the new metadata was published.
    #[error("the term has ended")]
    TermEnded,
    /// The store failed; the term goes on. After an [`ErrorKind::Ambiguous`] failure the
    /// new metadata may or may not have been published.
    #[error("the store could not publish the metadata")]
    Store(#[source] StoreError),
}
