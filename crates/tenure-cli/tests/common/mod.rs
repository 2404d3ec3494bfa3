//! What the CLI test files share.

#![allow(dead_code)]

use std::process::Child;

/// The binary under test: the one cargo built beside these tests, or the one
/// `TENURE_BIN` names (CI points it at a copy built with the planted bugs, so that their
/// checks can run while the tests run on the ordinary build).
pub fn tenure() -> &'static str {
    static BIN: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        std::env::var("TENURE_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_tenure").to_string())
    });
    &BIN
}

/// A child process that is killed when dropped, so a failed test leaves nothing running.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl std::ops::Deref for Proc {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Proc {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

/// The name a holder id was made from with `--id NAME`: the id without the '.' and 8
/// random characters each process adds (`a.k3j9x2ab` → `a`); any other id as it is.
#[allow(dead_code)]
pub fn name_of(holder: &str) -> &str {
    match holder.rsplit_once('.') {
        Some((name, r)) if r.len() == 8 && r.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()) => name,
        _ => holder,
    }
}

/// The resident memory of process `pid`, in kB (`VmRSS`).
pub fn rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}
