//! `tenure man`: man pages generated from the command-line definitions, so they never
//! disagree with `--help`.

use std::path::Path;

use anyhow::{Context, Result};

/// Writes the man page of `cmd` to stdout, or, with `dir`, one page for `tenure` and one
/// for each visible subcommand (`tenure-run.1`, …) into `dir`.
pub fn man(cmd: clap::Command, dir: Option<&Path>) -> Result<()> {
    let Some(dir) = dir else {
        let mut out = std::io::stdout().lock();
        return clap_mangen::Man::new(cmd).render(&mut out).context("cannot write the man page");
    };
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let cmd = cmd.name("tenure");
    let mut pages = vec![(String::from("tenure"), cmd.clone())];
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = format!("tenure-{}", sub.get_name());
        pages.push((name.clone(), sub.clone().name(name)));
    }
    for (name, page) in pages {
        let path = dir.join(format!("{name}.1"));
        let mut buf = Vec::new();
        clap_mangen::Man::new(page).render(&mut buf).context("cannot render a man page")?;
        std::fs::write(&path, buf).with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}
