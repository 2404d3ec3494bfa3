//! tenure's own proving ground, beside the public test kit ([`tenure_testkit`]):
//!
//! - [`sim`]: the deterministic simulation behind `tenure-sim`: the real runtime on
//!   simulated time against a store that fails in every way the fault model names;
//! - `tenure-torture` (a binary): rounds of real `tenure run` processes against real
//!   servers, killed, frozen, partitioned and skewed, with the history checked;
//! - `tenure-serve` (a binary): starts one throwaway server and prints its URL, for the
//!   benchmarks and for trying a store by hand.
//!
//! A store author needs none of this: the conformance suite, the scenario, the history
//! checker, the proxy and the server launchers are in `tenure-testkit`.

pub mod sim;
