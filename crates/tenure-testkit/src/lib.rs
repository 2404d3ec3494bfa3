//! Test support for tenure's store authors: what a new [`tenure::LeaseStore`] needs to
//! prove itself against a real server. (The simulation and the torture rounds, tenure's
//! own proving ground, are in the internal crate `tenure-lab`.)
//!
//! - [`conformance`]: the contract tests every [`tenure::LeaseStore`] passes.
//! - [`harness`]: how those tests and the [`scenario`] reach a store; [`harness::Served`]
//!   is the harness of a store on one throwaway server.
//! - [`faults`]: the store wrapper that injects failures (the core's, re-exported).
//! - [`history`]: a checker for recorded histories (invariants I1–I4).
//! - [`servers`]: throwaway servers from installed binaries: PostgreSQL, MariaDB, Redis,
//!   NATS, etcd, RabbitMQ, ZooKeeper, and the emulators Azurite, moto (S3, DynamoDB) and
//!   fake-gcs-server.
//! - [`scenario`]: the multi-candidate scenario every server store runs.
//! - [`proxy`]: a TCP proxy that cuts, black-holes or delays traffic.
//! - [`certs`]: a private certificate authority for TLS tests.

pub mod certs;
pub mod conformance;
pub mod harness;
pub use tenure::faults;
pub mod history;
pub mod proxy;
pub mod scenario;
pub mod servers;

/// A name unique to this run, for isolating tests that share a store.
pub fn unique(prefix: &str) -> String {
    let r: String = (0..8).map(|_| fastrand::alphanumeric().to_ascii_lowercase()).collect();
    format!("{prefix}-{r}")
}
