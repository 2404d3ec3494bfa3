//! What the CLI test files share.

#![allow(dead_code)]

use std::process::Child;

/// The binary under test.
pub const TENURE: &str = env!("CARGO_BIN_EXE_tenure");

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
