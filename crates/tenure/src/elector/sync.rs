//! Small synchronisation helpers, kept small because a process may hold thousands of electors.

use super::*;

/// Ends the campaign's outward state when the campaign task ends, however it ends.
pub(super) struct Stopped<'a>(pub(super) &'a Shared);

impl Stopped<'_> {
    pub(super) fn finish(shared: &Shared, crashed: bool) {
        // A campaign that stopped stops announcing itself too.
        if let Some(p) = &shared.presence {
            p.shared.shutdown.cancel();
        }
        if crashed {
            let mut f = shared.failure.lock().unwrap_or_else(|p| p.into_inner());
            f.get_or_insert(ElectError::Crashed);
        }
        if let Some(l) = shared.leadership.replace(None) {
            l.cancel.cancel();
        }
        shared.stopped.set();
    }
}

impl Drop for Stopped<'_> {
    fn drop(&mut self) {
        Stopped::finish(self.0, true);
    }
}

/// The leadership handed out, and a wake-up for those waiting for it to change: a `watch`
/// channel would do, at several times the size, in every elector of a process.
#[derive(Default)]
pub(super) struct Published {
    pub(super) current: Mutex<Option<Leadership>>,
    pub(super) changed: tokio::sync::Notify,
}

impl Published {
    pub(super) fn get(&self) -> Option<Leadership> {
        self.current.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Publishes `l`; returns what was published before.
    pub(super) fn replace(&self, l: Option<Leadership>) -> Option<Leadership> {
        let old = std::mem::replace(&mut *self.current.lock().unwrap_or_else(|p| p.into_inner()), l);
        self.changed.notify_waiters();
        old
    }
}

/// A flag that is set once, and waited for: a `watch` channel would do, at ten times the
/// size, in every elector of a process that may hold thousands.
#[derive(Default)]
pub(super) struct Flag {
    pub(super) set: std::sync::atomic::AtomicBool,
    pub(super) notify: tokio::sync::Notify,
}

impl Flag {
    pub(super) fn set(&self) {
        self.set.store(true, std::sync::atomic::Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    pub(super) async fn wait(&self) {
        once_seen(&self.notify, || self.set.load(std::sync::atomic::Ordering::SeqCst).then_some(())).await
    }
}

/// Waits until `look` finds something, looking again each time `notify` wakes it. The
/// wake-up is registered before each look, so a change made after a look is not missed.
pub(super) async fn once_seen<T>(notify: &tokio::sync::Notify, mut look: impl FnMut() -> Option<T>) -> T {
    loop {
        let changed = notify.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        if let Some(x) = look() {
            return x;
        }
        changed.await;
    }
}
