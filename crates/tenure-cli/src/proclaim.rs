//! `TENURE_METADATA_FILE`: a command that leads under `tenure run` publishes new metadata
//! by writing this file; `tenure run` proclaims what it holds within the term (the token
//! stays) and observers, `tenure status` and `tenure watch` see it. The file lives beside
//! the command's deadline file ([`crate::term::Supervised::spawn`]), one per term.

use std::path::PathBuf;
use std::sync::Mutex;

use tenure::{Leadership, ProclaimError};

/// The command's metadata file, looked at while it leads.
pub struct MetadataFile {
    path: PathBuf,
    /// Content refused as too large, warned about once.
    refused: Mutex<Option<Vec<u8>>>,
}

impl MetadataFile {
    /// The file at `path`.
    pub fn at(path: PathBuf) -> Self {
        Self { path, refused: Mutex::new(None) }
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
