//! `TENURE_METADATA_FILE`: a command that leads under `tenure run` publishes new metadata
//! by writing this file; `tenure run` proclaims what it holds within the term (the token
//! stays) and observers, `tenure status` and `tenure watch` see it.

use std::path::PathBuf;
use std::sync::Mutex;

use anyhow::{Context, Result};
use tenure::{Leadership, ProclaimError};

/// The file, in a directory of this process's own (mode 0700), removed when it ends.
pub struct MetadataFile {
    _dir: tempfile::TempDir,
    path: PathBuf,
    /// What a term starts with (`--metadata`).
    initial: Vec<u8>,
    /// Content refused as too large, warned about once.
    refused: Mutex<Option<Vec<u8>>>,
}

impl MetadataFile {
    /// Creates the file holding `initial` (the `--metadata` text).
    pub fn create(initial: &[u8]) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("tenure-run-")
            .tempdir()
            .context("cannot create a directory for TENURE_METADATA_FILE")?;
        let path = dir.path().join("metadata");
        let file = Self { _dir: dir, path, initial: initial.to_vec(), refused: Mutex::new(None) };
        file.reset()?;
        Ok(file)
    }

    /// Puts back what a term starts with, before a command starts: a new term publishes
    /// `--metadata`, not what the previous term's command wrote.
    pub fn reset(&self) -> Result<()> {
        std::fs::write(&self.path, &self.initial).with_context(|| format!("cannot write {}", self.path.display()))
    }

    /// The variable that names the file, for the command's environment.
    pub fn env(&self) -> (&'static str, String) {
        ("TENURE_METADATA_FILE", self.path.display().to_string())
    }

    /// Proclaims the file's content if it differs from what `l` publishes. A file being
    /// written may be read half-written: write a file beside it and rename it over.
    pub async fn publish(&self, l: &Leadership) {
        let Ok(content) = std::fs::read(&self.path) else { return };
        if content == l.leader().metadata {
            return;
        }
        match l.set_metadata(content.clone()).await {
            Ok(()) => tracing::info!(token = %l.token(), bytes = content.len(), "published new metadata"),
            Err(ProclaimError::TooLarge(n)) => {
                let mut refused = self.refused.lock().unwrap_or_else(|p| p.into_inner());
                if refused.as_ref() != Some(&content) {
                    tracing::warn!(
                        bytes = n,
                        "TENURE_METADATA_FILE holds more than a lease can publish (4096 bytes); ignored"
                    );
                    *refused = Some(content);
                }
            }
            Err(ProclaimError::TermEnded) => {}
            Err(e) => tracing::warn!(error = %anyhow::Error::from(e), "publishing new metadata failed; trying again"),
        }
    }
}
