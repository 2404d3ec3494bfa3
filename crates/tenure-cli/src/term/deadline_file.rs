//! The deadline file that `tenure` moves forward after each renewal and the supervisor
//! and guard read, and the other small files of a term's private directory.

use super::*;

/// The instant written in the deadline file; `None` when it cannot be read, which the
/// supervisor treats as a deadline already passed (it fails closed).
pub(super) fn read_stop_at(path: &Path) -> Option<u64> {
    match read_private(path) {
        // `tenure run` rewrites the record in place: a read that met a write half done
        // fails its check, and the next read finds it whole.
        Ok(s) => parse_stop_at(&s).or_else(|| read_private(path).ok().and_then(|s| parse_stop_at(&s))),
        // Planted (with the standby's wait skipped): a deadline file not yet written is
        // taken for no deadline.
        Err(_) if mutant("standby-starts-unbidden") => Some(u64::MAX),
        Err(_) => None,
    }
}

/// The instant stopping was due, if it has come by `now`: the deadline file's instant,
/// or `now` when the file cannot be read.
pub(super) fn passed_stop_at(path: &Path, now: u64) -> Option<u64> {
    match read_stop_at(path) {
        Some(stop_at) if now < stop_at => None,
        Some(stop_at) => Some(stop_at),
        None => Some(now),
    }
}

/// Why [`passed_stop_at`] said stop, for the log: a deadline that passed, or a deadline
/// file that could not be believed (and what was wrong with it), which is not the same
/// fault and is fixed elsewhere.
pub(super) fn stop_cause(path: &Path) -> String {
    match read_private(path) {
        Ok(s) if parse_stop_at(&s).is_some() => "the lease was not renewed in time".to_string(),
        Ok(_) => format!("the deadline file {} holds no deadline that tenure wrote", path.display()),
        Err(e) => format!("the deadline file cannot be believed ({e})"),
    }
}

/// When the grace period of a stop asked for now begins: now, or the instant stopping
/// was due if that has passed.
pub(super) fn stop_due(deadline_file: &Path) -> u64 {
    let now = boottime_ns();
    passed_stop_at(deadline_file, now).unwrap_or(now)
}

/// The file the supervisor creates when it stops the command itself.
pub(super) fn stopped_marker(deadline_file: &Path) -> PathBuf {
    deadline_file.with_extension("stopped")
}

/// The file the supervisor creates just before it starts the command: without it, a
/// supervisor that ended did not start it.
pub(super) fn started_marker(deadline_file: &Path) -> PathBuf {
    deadline_file.with_extension("started")
}

/// The file a standby supervisor creates once it can be told to start the command.
pub(super) fn ready_marker(deadline_file: &Path) -> PathBuf {
    deadline_file.with_extension("ready")
}

/// The file that tells a standby supervisor what to add to the command's environment:
/// `NAME\0VALUE\0` pairs, written before it is told to start.
pub(super) fn env_file(deadline_file: &Path) -> PathBuf {
    deadline_file.with_extension("env")
}

/// Writes `bytes` to `path` atomically: a reader finds the old content or the new.
pub(super) fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".new");
    write_private(Path::new(&tmp), bytes)?;
    std::fs::rename(tmp, path)
}

/// Writes `bytes` to `path`, a file only this user may read or write (0600 whatever the
/// umask), never through a symbolic link.
pub(crate) fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    f.write_all(bytes)
}

/// Reads `path`, but only a file of this user's that nobody else may write, reached
/// without a symbolic link: a deadline or environment file someone else made or could
/// change is not the one `tenure run` wrote, and is not believed (an error, which the
/// readers take as a deadline that has passed).
pub(super) fn read_private(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(code) if code == rustix::io::Errno::LOOP.raw_os_error() => std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!("{} is a symbolic link, not a file tenure wrote", path.display()),
            ),
            _ => e,
        })?;
    let meta = f.metadata()?;
    let own = meta.uid() == rustix::process::geteuid().as_raw() && meta.mode() & 0o022 == 0;
    if !own && !mutant("deadline-file-trusted") {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!("{} is not a file of this user's that only it may write", path.display()),
        ));
    }
    let mut buf = Vec::new();
    f.read_to_end(&mut buf)?;
    Ok(buf)
}

/// A deadline record: the instant in 20 digits and a check of it, so that a reader can
/// tell a record rewritten in place under its read (a mix of two) from a whole one. Every
/// record has the same length.
pub(super) fn stop_at_record(stop_at_ns: u64) -> Vec<u8> {
    format!("{stop_at_ns:020} {:016x}\n", stop_at_check(stop_at_ns)).into_bytes()
}

/// The check of a deadline record (a 64-bit mix of the instant).
pub(super) fn stop_at_check(stop_at_ns: u64) -> u64 {
    let mut z = stop_at_ns.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The instant in a deadline record; `None` if it is not whole. A bare number (as
/// written before records had a check) is taken as it is.
pub(super) fn parse_stop_at(bytes: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(bytes).ok()?.trim();
    match text.split_once(' ') {
        Some((instant, check)) => {
            let instant: u64 = instant.parse().ok()?;
            (u64::from_str_radix(check, 16).ok()? == stop_at_check(instant)).then_some(instant)
        }
        None => text.parse().ok(),
    }
}

/// Writes the instant by which the command must start stopping, atomically.
pub(super) fn write_stop_at(path: &Path, stop_at_ns: u64) -> std::io::Result<()> {
    write_atomically(path, &stop_at_record(stop_at_ns))
}

/// Opens the deadline file `tenure run` wrote, to rewrite it in place from then on: moving
/// the deadline then needs no new descriptor (a process out of descriptors, under a flood
/// of connections, still keeps its command's deadline).
pub(super) fn open_stop_at(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new().write(true).custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32).open(path)
}

/// The pairs of an environment file; `None` if it cannot be read or is malformed.
pub(super) fn read_env(path: &Path) -> Option<Vec<(OsString, OsString)>> {
    use std::os::unix::ffi::OsStringExt;
    let bytes = read_private(path).ok()?;
    if bytes.is_empty() {
        return Some(Vec::new());
    }
    let body = bytes.strip_suffix(b"\0")?;
    let fields: Vec<&[u8]> = body.split(|b| *b == 0).collect();
    if !fields.len().is_multiple_of(2) {
        return None;
    }
    Some(fields.chunks(2).map(|p| (OsString::from_vec(p[0].to_vec()), OsString::from_vec(p[1].to_vec()))).collect())
}

/// Removes the directory `tenure run` made for the deadline file (only one it made:
/// named `tenure-run-…`).
pub(super) fn remove_deadline_dir(deadline_file: &Path) {
    if let Some(dir) = deadline_file.parent()
        && dir.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("tenure-run-"))
    {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// The directory for a supervisor's files (its deadline, its marks, the metadata).
pub(super) fn supervisor_dir() -> Result<tempfile::TempDir> {
    use std::os::unix::fs::PermissionsExt;
    // Only this user may enter it, whatever the umask: what is in it says when the
    // command must stop, and what it runs with.
    tempfile::Builder::new()
        .prefix("tenure-run-")
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir()
        .context("cannot create the command's deadline file")
}

/// Writes `metadata`, if any, into `dir` and names it in `env` as `TENURE_METADATA_FILE`.
pub(super) fn write_metadata(
    dir: &Path,
    metadata: Option<&[u8]>,
    env: &mut Vec<(&str, String)>,
) -> Result<Option<PathBuf>> {
    let Some(m) = metadata else { return Ok(None) };
    let file = dir.join("metadata");
    write_private(&file, m).context("cannot write TENURE_METADATA_FILE")?;
    env.push(("TENURE_METADATA_FILE", file.display().to_string()));
    Ok(Some(file))
}
