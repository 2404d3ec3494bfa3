//! Choosing a store from a URL: the table and the opening are `tenure-stores`'s, shared
//! with library users; here, what only the tool does (`--store-file`, errors as `anyhow`).

use std::sync::Arc;

use anyhow::{Context, Result};
use tenure::LeaseStore;
pub use tenure_stores::forms;

/// The store URL in the first line of `path` (`--store-file`): a file of this user's
/// that nobody else may read or write, since the URL may carry a password.
pub fn read_store_file(path: &std::path::Path) -> Result<String> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).with_context(|| format!("cannot read the store file {}", path.display()))?;
    if meta.uid() != rustix::process::geteuid().as_raw() {
        anyhow::bail!(
            "the store file {} belongs to another user (uid {}): it must be yours",
            path.display(),
            meta.uid()
        );
    }
    if meta.mode() & 0o077 != 0 {
        anyhow::bail!(
            "the store file {} may be read or written by others (mode {:o}): it may hold a password; chmod 600 it",
            path.display(),
            meta.mode() & 0o777
        );
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read the store file {}", path.display()))?;
    let url = text.lines().map(str::trim).find(|l| !l.is_empty() && !l.starts_with('#'));
    url.map(str::to_string).with_context(|| format!("the store file {} names no store URL", path.display()))
}

/// Opens the store `url` names, or the default SQLite database when `url` is `None`.
pub async fn open(url: Option<&str>) -> Result<Arc<dyn LeaseStore>> {
    match url.map(str::trim).filter(|u| !u.is_empty()) {
        None => Ok(tenure_stores::connect_default().await?),
        Some(url) => Ok(tenure_stores::connect(url).await?),
    }
}

/// The error for a part (`what`: "the PostgreSQL store") this build was compiled without.
#[allow(dead_code)] // unused when every part is built in
pub fn missing(what: &str, feature: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "{what} is not in this build of tenure: it was built without the `{feature}` feature \
         (cargo install tenure-cli --features {feature}, or build with the default features)"
    )
}

#[cfg(test)]
mod tests {
    use tenure_stores::STORES;

    /// The help and docs/cli.md list what the table says, and each scheme names one family.
    #[test]
    fn the_store_table_is_the_one_list() {
        use clap::CommandFactory;
        let help = crate::Cli::command().render_long_help().to_string();
        let cli_md = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/cli.md")).unwrap();
        let mut seen = std::collections::HashSet::new();
        for kind in STORES {
            assert!(help.contains(kind.form.split(" (").next().unwrap()), "--help lacks {}", kind.form);
            for scheme in kind.schemes {
                assert!(seen.insert(*scheme), "{scheme} names two stores");
                let named = if *scheme == "sqlite" { "sqlite:".to_string() } else { format!("{scheme}://") };
                assert!(cli_md.contains(&format!("`{named}")), "docs/cli.md lacks {named}");
            }
        }
    }
}
