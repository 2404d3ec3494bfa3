//! A unit of work done once across replicas: [`Elector::run_once`].

use std::future::Future;
use std::sync::Arc;

use crate::elector::{ElectError, Elector, Leadership};
use crate::ledger::{self, Claim, Policy, Refusal, WorkEntry, WorkState, in_term};
use crate::name::WorkKey;
use crate::record::FencingToken;

/// What [`Elector::run_once`] came to.
#[derive(Debug)]
#[non_exhaustive]
pub enum Once<T, E> {
    /// This candidate ran the task within a term and it succeeded.
    Ran {
        /// What the task returned.
        output: T,
        /// The term it ran in.
        token: FencingToken,
        /// Which run of the key it was (1 for the first).
        attempt: u32,
        /// Whether the key was marked done. False only if the term ended (or the store
        /// stayed unreachable) between the task's end and the mark: a later term then
        /// runs the key again, with a larger token.
        recorded: bool,
    },
    /// A run of the key had finished before, here or on another candidate: the task did
    /// not run.
    AlreadyDone(WorkEntry),
    /// The task ran within a term and failed; the key stays open for another attempt
    /// (a later call, or another candidate), up to [`Policy::attempts`] runs in all.
    Failed {
        /// What the task returned.
        error: E,
        /// The term it ran in.
        token: FencingToken,
        /// Which run of the key it was.
        attempt: u32,
    },
    /// The key will not run here: its attempts are used up, or (at most once) a run of it
    /// may have started before.
    Refused {
        /// The key's entry.
        entry: WorkEntry,
        /// Why.
        why: Refusal,
    },
}

impl Elector {
    /// Runs `task` once for `key` across every candidate of this election: only while
    /// this candidate leads, only if no run of the key has finished (within
    /// [`Policy::keep`]), and never while another run of it goes on. The task gets the
    /// term's [`Leadership`] (pass its token to what it writes) and the run's number.
    ///
    /// `Ok` marks the key done; `Err` marks the run failed and leaves the key open. A run
    /// whose term ends first (this candidate lost the lease, was frozen past its deadline,
    /// resigned) is cancelled through [`Leadership::cancelled`], as in
    /// [`Elector::run_while_leader`], and the key runs again in a later term, here or
    /// elsewhere, with a larger token ([`ledger::Guarantee::AtLeastOnce`]), or never
    /// ([`ledger::Guarantee::AtMostOnce`]). A key already done is answered at once,
    /// before campaigning. When it returns, the elector has shut down and released its
    /// lease, so that the next candidate finds the key's state at once.
    ///
    /// ```no_run
    /// # use std::{sync::Arc, time::Duration};
    /// # use tenure::{Elector, MemoryStore, Once, WorkKey, ledger::Policy};
    /// # async fn t() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = Arc::new(MemoryStore::new());
    /// let elector = Elector::builder(store, "billing/nightly").build()?;
    /// let key = WorkKey::new("2026-11-27")?;
    /// match elector.run_once(&key, Policy::default(), |l, _attempt| async move {
    ///     // the report, fenced with l.token()
    ///     Ok::<_, std::io::Error>(l.token())
    /// }).await? {
    ///     Once::Ran { .. } => println!("ran it"),
    ///     Once::AlreadyDone(entry) => println!("{} did it", entry.holder),
    ///     other => println!("{other:?}"),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn run_once<F, Fut, T, E>(
        &self,
        key: &WorkKey,
        policy: Policy,
        mut task: F,
    ) -> Result<Once<T, E>, ElectError>
    where
        F: FnMut(Leadership, u32) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        if self.config().holders > 1 {
            return Err(ElectError::Unsupported(format!(
                "run_once runs a unit of work on one holder; {} has {} holders",
                self.election(),
                self.config().holders
            )));
        }
        let store = self.store().clone();
        let election = self.election().clone();
        // A key done already: nothing to campaign for (a failed read only means asking again
        // when leading).
        if let Ok(Some(done)) = ledger::read(&*store, &election, key).await
            && done.state == WorkState::Done
        {
            self.shutdown().await;
            return Ok(Once::AlreadyDone(done));
        }
        loop {
            let l = match self.leadership().await {
                Ok(l) => l,
                Err(e) => {
                    self.shutdown().await;
                    return Err(e);
                }
            };
            let token = l.token();
            let claimed = ledger::claim_in_term(&*store, &l, key, &policy).await;
            let attempt = match claimed {
                Ok(Some(Claim::Run { attempt, .. })) => attempt,
                // The term ended first, or a later one has the key: this term is over.
                Ok(None) | Ok(Some(Claim::Refused(_, Refusal::LaterTerm))) => {
                    l.cancelled().await;
                    continue;
                }
                Ok(Some(Claim::Done(entry))) => return self.end(l, Ok(Once::AlreadyDone(entry))).await,
                Ok(Some(Claim::Refused(entry, why))) => return self.end(l, Ok(Once::Refused { entry, why })).await,
                Err(e) => return self.end(l, Err(ElectError::Store(Arc::new(e)))).await,
            };
            let cancel = l.cancellation_token();
            let mut run = Box::pin(task(l.clone(), attempt));
            let out = tokio::select! {
                biased;
                out = &mut run => Some(out),
                _ = cancel.cancelled() => None,
            };
            // A task that ends after its term did (a `while is_valid()` loop), or is
            // cancelled by its end, was cut short: the key runs again in a later term.
            let out = match out {
                Some(out) if !cancel.is_cancelled() && l.is_valid() => out,
                Some(_) => continue,
                None => {
                    // Let it wind down before the lease can be released.
                    let _ = run.await;
                    continue;
                }
            };
            drop(run);
            let ended = match &out {
                Ok(_) => in_term(&l, || ledger::complete(&*store, &election, key, token, policy.keep)).await,
                Err(_) => in_term(&l, || ledger::fail(&*store, &election, key, token, policy.keep)).await,
            };
            let recorded = matches!(ended, Ok(Some(true)));
            if !recorded {
                tracing::warn!(%election, %key, %token, "the run's end could not be recorded before its term ended");
            }
            let once = match out {
                Ok(output) => Once::Ran { output, token, attempt, recorded },
                Err(error) => Once::Failed { error, token, attempt },
            };
            return self.end(l, Ok(once)).await;
        }
    }

    /// Lets go of `l`, shuts the elector down (releasing the lease), and answers `out`.
    async fn end<T>(&self, l: Leadership, out: T) -> T {
        drop(l);
        self.shutdown().await;
        out
    }
}
