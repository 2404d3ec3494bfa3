//! The clock the runtime reads time through, so tests and simulations can control it.

use std::future::Future;
use std::pin::Pin;

pub use tokio::time::Instant;

/// A monotonic clock. The runtime and the memory store read time only through this.
///
/// [`TokioClock`] follows tokio's clock, so `#[tokio::test(start_paused = true)]`
/// runs the runtime on paused time; a simulation can supply clocks that drift.
pub trait Clock: Send + Sync + 'static {
    /// The current instant.
    fn now(&self) -> Instant;

    /// Completes once [`Clock::now`] has reached `deadline`.
    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn Future<Output = ()> + Send + 'static>>;
}

/// tokio's monotonic clock (paused in tests that pause it).
#[derive(Clone, Copy, Debug, Default)]
pub struct TokioClock;

impl Clock for TokioClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn Future<Output = ()> + Send + 'static>> {
        Box::pin(tokio::time::sleep_until(deadline))
    }
}
