//! `tenure status`, `list`, `evict` and `watch`.

use std::io::{BufRead, IsTerminal, Write};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use tenure::{ElectionName, Evict, HolderId, Leader, LeaseRecord, LeaseStore};
use tokio_stream::StreamExt;

/// `t` in RFC 3339 (to the millisecond with `millis`), or `None` for a time before 1970
/// or after 9999, which a hostile or corrupted record may hold and RFC 3339 cannot show.
pub(crate) fn rfc3339(t: SystemTime, millis: bool) -> Option<String> {
    const LAST: u64 = 253_402_300_799; // 9999-12-31T23:59:59Z
    let since = t.duration_since(std::time::UNIX_EPOCH).ok()?;
    (since.as_secs() <= LAST).then(|| {
        if millis {
            humantime::format_rfc3339_millis(t).to_string()
        } else {
            humantime::format_rfc3339_seconds(t).to_string()
        }
    })
}

fn time(t: Option<SystemTime>) -> Value {
    t.and_then(|t| rfc3339(t, true)).map(Value::String).unwrap_or(Value::Null)
}

/// Metadata as JSON carries it (escaped there).
fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Metadata for a terminal: control characters (escape sequences that would set a window
/// title or colours, line breaks that would forge lines) shown as `\u{…}`, not sent.
pub(crate) fn printable(bytes: &[u8]) -> String {
    let mut out = String::new();
    for c in String::from_utf8_lossy(bytes).chars() {
        if unsafe_char(c) {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    out
}

/// Whether `c` must not reach a terminal as it is: a control character (C0, DEL, C1:
/// `\u{9b}` starts an escape sequence on many terminals), or a mark that reorders or breaks
/// lines (a right-to-left override would make `a.sh` read as `hs.a`).
fn unsafe_char(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{61c}' | '\u{200e}' | '\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `v` as one line of JSON in which every [`unsafe_char`] is written as a `\uXXXX`
/// escape. JSON escapes only C0 controls itself, and such characters appear only inside
/// its strings, so the line is the same JSON for any parser and harmless on a terminal.
pub(crate) fn json_line(v: &Value) -> String {
    let raw = v.to_string();
    if !raw.chars().any(unsafe_char) {
        return raw;
    }
    let mut out = String::with_capacity(raw.len() + 16);
    for c in raw.chars() {
        if unsafe_char(c) {
            // Every such character is in the Basic Multilingual Plane: one escape each.
            out.push_str(&format!("\\u{:04x}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

/// Most bytes of an election's metadata the HTTP endpoints and the dashboard's pages are
/// sent; the rest is cut off, and the whole length given (`metadata_bytes`). A record of
/// many megabytes (written by hand into the store) would otherwise be copied for every
/// request and page.
pub(crate) const MAX_METADATA_SHOWN: usize = 4096;

/// `status_json` of `r` with its metadata cut to [`MAX_METADATA_SHOWN`] bytes (then with
/// `metadata_bytes`, the whole length), for the HTTP endpoints and the dashboard.
pub(crate) fn status_json_for_http(election: &str, r: Option<&LeaseRecord>) -> Value {
    let mut v = status_json(election, None);
    if let Some(r) = r {
        let shown = &r.metadata[..r.metadata.len().min(MAX_METADATA_SHOWN)];
        let mut shown = String::from_utf8_lossy(shown).into_owned();
        let leader = if r.metadata.len() > MAX_METADATA_SHOWN {
            shown.push('…');
            let mut l = leader_json_showing(r, shown);
            l["metadata_bytes"] = json!(r.metadata.len());
            l
        } else {
            leader_json_showing(r, shown)
        };
        v["leader"] = leader;
    }
    v
}

/// The JSON object for one leader (the `leader` field of `status --json`).
fn leader_json(r: &LeaseRecord) -> Value {
    leader_json_showing(r, text(&r.metadata))
}

/// [`leader_json`] with `metadata` for the record's metadata.
fn leader_json_showing(r: &LeaseRecord, metadata: String) -> Value {
    json!({
        "holder": r.holder.as_str(),
        "token": r.token.0,
        "acquired_at": time(r.acquired_at),
        "renewed_at": time(r.renewed_at),
        "expires_in_ms": r.remaining.map(|d| d.as_millis() as u64),
        "evicted": r.evicted,
        "metadata": metadata,
    })
}

/// The leader object when the record could not be read: the same fields, the times null.
fn leader_json_without_record(l: &Leader) -> Value {
    json!({
        "holder": l.holder.as_str(),
        "token": l.token.0,
        "acquired_at": null,
        "renewed_at": null,
        "expires_in_ms": null,
        "evicted": false,
        "metadata": text(&l.metadata),
    })
}

pub fn status_json(election: &str, r: Option<&LeaseRecord>) -> Value {
    json!({ "election": election, "leader": r.map(leader_json) })
}

fn ago(t: Option<SystemTime>) -> String {
    match t {
        Some(t) => match rfc3339(t, false) {
            Some(at) => {
                let age = SystemTime::now().duration_since(t).unwrap_or_default();
                format!("{at} ({} ago)", humantime::format_duration(Duration::from_secs(age.as_secs())))
            }
            None => "(a time out of range)".into(),
        },
        None => "-".into(),
    }
}

fn expires(r: &LeaseRecord) -> String {
    match r.remaining {
        Some(d) => format!("in {:.1}s", d.as_secs_f64()),
        None => "-".into(),
    }
}

/// `tenure status`.
pub async fn status(store: Arc<dyn LeaseStore>, election: &ElectionName, as_json: bool) -> Result<()> {
    let rec = store.get(election).await.with_context(|| format!("cannot read {election}"))?;
    let holders = tenure::holders::holders(&*store, election)
        .await
        .with_context(|| format!("cannot list the holders of {election}"))?;
    let candidates = tenure::candidates(&*store, election)
        .await
        .with_context(|| format!("cannot list the candidates of {election}"))?;
    let mut out = std::io::stdout().lock();
    if as_json {
        let mut v = status_json(election.as_str(), rec.as_ref());
        v["holders"] = holders.iter().map(holder_json).collect();
        v["candidates"] = candidates.iter().map(candidate_json).collect();
        writeln!(out, "{}", json_line(&v))?;
        return Ok(());
    }
    match &rec {
        None if !holders.is_empty() => {
            writeln!(out, "election  {election}")?;
            writeln!(out, "holders   {} (an election with several holders)", holders.len())?;
            for h in &holders {
                let r = &h.record;
                writeln!(
                    out,
                    "  [{}] {}{}  token {}  since {}  expires {}{}",
                    h.index,
                    r.holder,
                    if r.evicted { " (evicted: stepping down)" } else { "" },
                    h.token,
                    ago(r.acquired_at),
                    expires(r),
                    if r.metadata.is_empty() {
                        String::new()
                    } else {
                        format!("  metadata {}", printable(&r.metadata))
                    }
                )?;
            }
        }
        None => writeln!(out, "{election}: no leader")?,
        Some(r) => {
            writeln!(out, "election  {election}")?;
            writeln!(out, "leader    {}{}", r.holder, if r.evicted { "  (evicted: stepping down)" } else { "" })?;
            writeln!(out, "token     {}", r.token)?;
            writeln!(out, "since     {}", ago(r.acquired_at))?;
            writeln!(out, "renewed   {}", ago(r.renewed_at))?;
            writeln!(out, "expires   {}", expires(r))?;
            if !r.metadata.is_empty() {
                writeln!(out, "metadata  {}", printable(&r.metadata))?;
            }
            if let Some(h) = candidates.iter().find(|c| c.holder == r.holder).and_then(|c| c.health) {
                writeln!(out, "health    {}  (its own check, published with its presence)", h.as_str())?;
            }
        }
    }
    if !candidates.is_empty() {
        writeln!(out, "candidates (that announce themselves)")?;
        for c in &candidates {
            let lead = rec.as_ref().is_some_and(|r| r.holder == c.holder && !r.evicted)
                || holders.iter().any(|h| h.record.holder == c.holder && !h.record.evicted);
            writeln!(
                out,
                "  {}{}  priority {}  seen {}{}",
                c.holder,
                if lead { " (leader)" } else { "" },
                c.priority,
                ago(c.seen_at),
                if c.metadata.is_empty() { String::new() } else { format!("  metadata {}", printable(&c.metadata)) }
            )?;
        }
    }
    Ok(())
}

/// One holder of an election with several, as `status --json` and `list --json` show it:
/// the leader object with the holder's token, and its index.
pub(crate) fn holder_json(h: &tenure::holders::Holder) -> Value {
    let mut v = leader_json(&h.record);
    v["token"] = json!(h.token.0);
    v["index"] = json!(h.index);
    v
}

/// A candidate as `status --json` shows it.
fn candidate_json(c: &tenure::Candidate) -> Value {
    json!({
        "holder": c.holder.as_str(),
        "priority": c.priority,
        "health": c.health.map(tenure::Health::as_str),
        "seen_at": time(c.seen_at),
        "expires_in_ms": c.expires_in.map(|d| d.as_millis() as u64),
        "metadata": text(&c.metadata),
    })
}

/// Whether `tenure list` shows `r`: not tenure's own records (presence leases), unless
/// asked for by prefix.
pub fn listed(r: &LeaseRecord, prefix: &str) -> bool {
    prefix.starts_with(tenure::RESERVED_PREFIX) || !r.election.as_str().starts_with(tenure::RESERVED_PREFIX)
}

/// One row of a listing: an election and its leader, or one holder of an election with
/// several (its index, and its record with the holder's token).
pub(crate) type Row = (String, Option<u32>, LeaseRecord);

/// What `tenure list` and the dashboard show under `prefix`: each election's leader, and
/// each holder of an election with several, by name and index; tenure's own records only
/// when asked for by prefix.
pub(crate) async fn rows(store: &dyn LeaseStore, prefix: &str) -> Result<Vec<Row>> {
    let mut recs = store.list(prefix).await.context("cannot list the elections")?;
    let own = prefix.starts_with(tenure::RESERVED_PREFIX);
    if !prefix.is_empty() && !own {
        let slots = format!("{}holders/{prefix}", tenure::RESERVED_PREFIX);
        recs.extend(store.list(&slots).await.context("cannot list the elections")?);
    }
    let mut rows: Vec<Row> = Vec::new();
    for mut r in recs {
        match tenure::holders::parse_slot(&r.election) {
            Some((e, i)) if !own && e.as_str().starts_with(prefix) => {
                r.token = tenure::holders::holder_token(r.token, i);
                rows.push((e.to_string(), Some(i), r));
            }
            _ if listed(&r, prefix) => rows.push((r.election.to_string(), None, r)),
            _ => {}
        }
    }
    rows.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
    Ok(rows)
}

/// How a row's election is shown: `name`, or `name [index]` for one holder of several.
pub(crate) fn row_name(e: &str, i: Option<u32>) -> String {
    match i {
        Some(i) => format!("{e} [{i}]"),
        None => e.to_string(),
    }
}

/// `tenure list`.
pub async fn list(store: Arc<dyn LeaseStore>, prefix: &str, as_json: bool) -> Result<()> {
    let rows = rows(&*store, prefix).await?;
    let mut out = std::io::stdout().lock();
    if as_json {
        let all: Vec<Value> = rows
            .iter()
            .map(|(e, i, r)| {
                let mut v = status_json(e, Some(r));
                if let Some(i) = i {
                    v["leader"]["index"] = json!(i);
                }
                v
            })
            .collect();
        writeln!(out, "{}", json_line(&Value::Array(all)))?;
        return Ok(());
    }
    if rows.is_empty() {
        writeln!(
            out,
            "no elections have a leader{}",
            if prefix.is_empty() { String::new() } else { format!(" under {prefix:?}") }
        )?;
        return Ok(());
    }
    let shown = |e: &str, i: &Option<u32>| row_name(e, *i);
    let width = rows.iter().map(|(e, i, _)| shown(e, i).len()).max().unwrap_or(8).max(8);
    let hwidth = rows.iter().map(|(_, _, r)| r.holder.as_str().len()).max().unwrap_or(6).max(6);
    writeln!(out, "{:width$}  {:hwidth$}  {:>6}  {:>9}  METADATA", "ELECTION", "LEADER", "TOKEN", "EXPIRES")?;
    for (e, i, r) in &rows {
        let holder = if r.evicted { format!("{} (evicted)", r.holder) } else { r.holder.to_string() };
        writeln!(
            out,
            "{:width$}  {:hwidth$}  {:>6}  {:>9}  {}",
            shown(e, i),
            holder,
            r.token.0,
            expires(r),
            printable(&r.metadata)
        )?;
    }
    Ok(())
}

/// How often `tenure watch` reads the holders of an election with several; until it has
/// seen one, it reads every [`HOLDERS_LOOKED_FOR_EVERY`] (an election with one holder
/// has none).
const HOLDERS_READ_EVERY: Duration = Duration::from_secs(1);
const HOLDERS_LOOKED_FOR_EVERY: Duration = Duration::from_secs(10);

/// `tenure watch`'s lines for the holders of an election with several: the holders are
/// read with one `list` each time, and each index whose holder changed gets a line.
async fn watch_holders(store: Arc<dyn LeaseStore>, election: ElectionName, as_json: bool) {
    let mut last: std::collections::BTreeMap<u32, (String, u64)> = Default::default();
    let mut ever = false;
    loop {
        match tenure::holders::holders(&*store, &election).await {
            Ok(now) => {
                let seen: std::collections::BTreeMap<u32, (String, u64)> =
                    now.iter().map(|h| (h.index, (h.record.holder.to_string(), h.token.0))).collect();
                let indices: std::collections::BTreeSet<u32> = seen.keys().chain(last.keys()).copied().collect();
                let time = humantime::format_rfc3339_millis(SystemTime::now()).to_string();
                let mut out = std::io::stdout().lock();
                for i in indices.into_iter().filter(|i| seen.get(i) != last.get(i)) {
                    let holder = now.iter().find(|h| h.index == i);
                    let line = match (holder, as_json) {
                        (h, true) => json_line(&json!({
                            "time": time, "election": election.as_str(), "index": i,
                            "leader": h.map(holder_json),
                        })),
                        (Some(h), false) => {
                            format!("{time}  {election} [{i}]  holder {} (token {})", h.record.holder, h.token)
                        }
                        (None, false) => format!("{time}  {election} [{i}]  no holder"),
                    };
                    let _ = writeln!(out, "{line}");
                }
                let _ = out.flush();
                ever |= !seen.is_empty();
                last = seen;
            }
            Err(e) => tracing::debug!(%election, error = %e, "could not read the holders; reading again"),
        }
        tokio::time::sleep(if ever { HOLDERS_READ_EVERY } else { HOLDERS_LOOKED_FOR_EVERY }).await;
    }
}

/// `tenure evict`; with `to`, a handover to that announcing candidate.
pub async fn evict(
    store: Arc<dyn LeaseStore>,
    election: &ElectionName,
    yes: bool,
    now: bool,
    to: Option<HolderId>,
) -> Result<i32> {
    let Some(cur) = store.get(election).await.with_context(|| format!("cannot read {election}"))? else {
        // An election with several holders: each holder is evicted through its slot.
        let holders = tenure::holders::holders(&*store, election)
            .await
            .with_context(|| format!("cannot list the holders of {election}"))?;
        if !holders.is_empty() {
            let slots: Vec<String> = holders
                .iter()
                .map(|h| format!("{} (holder {}, index {})", h.record.election, h.record.holder, h.index))
                .collect();
            bail!(
                "{election} has {} holders and no single leader; evict one holder by its slot's name: {}",
                holders.len(),
                slots.join(", ")
            );
        }
        println!("{election}: no leader; nothing to evict");
        return Ok(0);
    };
    let to = match to {
        Some(to) => {
            let named = |h: &HolderId| *h == to || h.instance_name() == Some(to.as_str());
            if named(&cur.holder) && !cur.evicted {
                println!("{} already leads {election}; nothing to do", cur.holder);
                return Ok(0);
            }
            Some(check_successor(&*store, election, &to).await?)
        }
        None => None,
    };
    if !yes {
        if !std::io::stdin().is_terminal() {
            eprintln!(
                "tenure: evict asks for confirmation; not on a terminal, so pass --yes to evict {} from {election}",
                cur.holder
            );
            return Ok(2);
        }
        eprint!(
            "Evict {} (token {}) from {election}{}{}? [y/N] ",
            cur.holder,
            cur.token,
            to.as_ref().map(|t| format!(" and hand over to {t}")).unwrap_or_default(),
            if now { " AT ONCE" } else { "" }
        );
        std::io::stderr().flush()?;
        let mut answer = String::new();
        std::io::stdin().lock().read_line(&mut answer)?;
        if !matches!(answer.trim(), "y" | "Y" | "yes") {
            eprintln!("not evicted");
            return Ok(1);
        }
    }
    // The reservation comes first: once evicted, the leader may release at once.
    let reservation = match &to {
        Some(to) => {
            let by =
                HolderId::new(format!("tenure-evict@{}", tenure::host_name())).unwrap_or_else(|_| HolderId::generate());
            let r = tenure::reserve(&*store, election, to, &by, cur.ttl)
                .await
                .with_context(|| format!("cannot reserve {election} for {to}"))?;
            Some(r)
        }
        None => None,
    };
    // The answer (or the reservation) may have taken a while: evict only the leader that
    // was asked about.
    let now_cur = store.get(election).await.with_context(|| format!("cannot read {election}"))?;
    if now_cur.as_ref().map(|r| (&r.holder, r.token)) != Some((&cur.holder, cur.token)) {
        if let Some(r) = &reservation {
            let _ = store.release(r).await;
        }
        if let (Some(to), Some(r)) = (&to, &now_cur)
            && r.holder == *to
        {
            println!("{to} leads {election} now (token {})", r.token);
            return Ok(0);
        }
        bail!(
            "the leader of {election} changed meanwhile (now {}); nothing was evicted",
            now_cur.map(|r| format!("{} with token {}", r.holder, r.token)).unwrap_or_else(|| "none".into())
        );
    }
    let how = if now { Evict::Now } else { Evict::AfterTerm };
    let evicted = store.evict(election, how).await.with_context(|| format!("cannot evict the leader of {election}"))?;
    match &evicted {
        None => println!("{election}: no leader; nothing to evict"),
        Some(r) if now => {
            println!("evicted {} (token {}) from {election} at once", r.holder, r.token);
            eprintln!(
                "warning: if {} is still alive it may keep acting until its own deadline while a new leader acts too; \
                 use --now only for a leader known to be dead",
                r.holder
            );
        }
        Some(r) => println!(
            "evicted {} (token {}) from {election}: it stops its work and releases; nobody else can lead before that or before its term ends ({})",
            r.holder,
            r.token,
            expires(r)
        ),
    }
    match (to, reservation) {
        (Some(to), Some(reservation)) => {
            hand_over(&*store, election, &to, reservation, evicted.as_ref().unwrap_or(&cur)).await
        }
        _ => Ok(0),
    }
}

/// The announcing candidate `to` names: its holder id, or the `--id` it was given if
/// one live candidate has that name. Refuses a successor that is not a live announcing
/// candidate, or a name two of them were given; warns when a candidate of higher
/// priority would take the election from it.
async fn check_successor(store: &dyn LeaseStore, election: &ElectionName, to: &HolderId) -> Result<HolderId> {
    let candidates = tenure::candidates(store, election)
        .await
        .with_context(|| format!("cannot list the candidates of {election}"))?;
    let named: Vec<_> = candidates.iter().filter(|c| c.holder.instance_name() == Some(to.as_str())).collect();
    if named.len() > 1 {
        let ids: Vec<&str> = named.iter().map(|c| c.holder.as_str()).collect();
        bail!(
            "{} announced candidates of {election} were given the name {to} ({}); name one by its holder id",
            named.len(),
            ids.join(", ")
        );
    }
    let Some(target) = candidates.iter().find(|c| c.holder == *to).or(named.first().copied()) else {
        let names: Vec<&str> = candidates.iter().map(|c| c.holder.as_str()).collect();
        bail!(
            "{to} is not an announced candidate of {election} ({}); only a candidate started with --announce or --priority can be handed the election",
            if names.is_empty() {
                "none announce themselves".to_string()
            } else {
                format!("announced: {}", names.join(", "))
            }
        );
    };
    if let Some(higher) = candidates.iter().filter(|c| c.priority > target.priority).max_by_key(|c| c.priority) {
        eprintln!(
            "warning: {} has priority {}, above {to}'s {}: once {to} leads, it will hand over to {}",
            higher.holder, higher.priority, target.priority, higher.holder
        );
    }
    Ok(target.holder.clone())
}

/// Keeps the reservation for `to` until it leads (renewing it every third of its TTL),
/// at most until the evicted term has run out and two TTLs more.
async fn hand_over(
    store: &dyn LeaseStore,
    election: &ElectionName,
    to: &HolderId,
    mut reservation: LeaseRecord,
    evicted: &LeaseRecord,
) -> Result<i32> {
    // A record's TTL is the store's word: at most a day here, whatever a corrupted one says.
    let ttl = evicted.ttl.min(tenure::store::MAX_TTL);
    let give_up = tokio::time::Instant::now() + evicted.remaining.unwrap_or(ttl).min(ttl) + ttl * 2;
    let mut renew_at = tokio::time::Instant::now() + ttl / 3;
    let poll = (ttl / 20).clamp(Duration::from_millis(20), Duration::from_millis(200));
    loop {
        match store.get(election).await.with_context(|| format!("cannot read {election}"))? {
            Some(r) if r.holder == *to && !r.evicted => {
                let _ = store.release(&reservation).await;
                println!("{to} leads {election} now (token {})", r.token);
                return Ok(0);
            }
            // Someone else: an announcing candidate gives the lease back at once (while
            // `to` announces itself); one that does not announce itself keeps it.
            Some(r) if r.holder != evicted.holder && !r.evicted => {
                // A failed listing is tried again at the next look.
                if let Ok(c) = tenure::candidates(store, election).await {
                    if !c.iter().any(|c| c.holder == *to) {
                        let _ = store.release(&reservation).await;
                        bail!("{to} stopped announcing itself; {} holds {election} (token {})", r.holder, r.token);
                    }
                    if !c.iter().any(|c| c.holder == r.holder) {
                        let _ = store.release(&reservation).await;
                        bail!(
                            "{} took {election} (token {}) instead of {to}: a candidate that does not announce itself ignores reservations",
                            r.holder,
                            r.token
                        );
                    }
                }
            }
            _ => {}
        }
        let now = tokio::time::Instant::now();
        if now >= give_up {
            let _ = store.release(&reservation).await;
            bail!("{to} did not take over {election} in time; the reservation is withdrawn, so any candidate may lead");
        }
        if now >= renew_at {
            renew_at = now + ttl / 3;
            match store.renew(&reservation, ttl).await {
                Ok(tenure::store::Renew::Renewed(r)) => reservation = r,
                Ok(tenure::store::Renew::Lost(by)) => {
                    // Unless `to` took it and ended it, someone else decided meanwhile.
                    if let Some(r) = store.get(election).await.ok().flatten().filter(|r| r.holder == *to && !r.evicted)
                    {
                        println!("{to} leads {election} now (token {})", r.token);
                        return Ok(0);
                    }
                    let why = match by {
                        Some(b) => format!("replaced by {}'s", b.holder),
                        None => "withdrawn".into(),
                    };
                    bail!("the reservation of {election} for {to} was {why} before {to} led");
                }
                Err(_) => {}
            }
        }
        tokio::time::sleep(poll).await;
    }
}

/// `tenure watch`: one line per change of leader, or of what the leader publishes,
/// until interrupted.
pub async fn watch(store: Arc<dyn LeaseStore>, election: &ElectionName, as_json: bool) -> Result<()> {
    tokio::spawn(watch_holders(store.clone(), election.clone(), as_json));
    let observer = tenure::observe(store.clone(), election.clone());
    let mut changes = Box::pin(observer.into_stream());
    let stop = crate::run::stop_on_signals()?;
    let mut last: Option<Leader> = None;
    loop {
        let leader: Option<Leader> = tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            next = changes.next() => match next {
                Some(l) => l,
                None => bail!("the watch on {election} stopped"),
            },
        };
        let now = humantime::format_rfc3339_millis(SystemTime::now());
        let line = match (&leader, as_json) {
            (_, true) => {
                // The same leader object as `status --json`: the record as it stands, when
                // it is still this term's (one read per change of leader).
                let leader_obj = match &leader {
                    None => Value::Null,
                    Some(l) => match store.get(election).await {
                        Ok(Some(r)) if r.holder == l.holder && r.token == l.token => leader_json(&r),
                        _ => leader_json_without_record(l),
                    },
                };
                json_line(&json!({ "time": now.to_string(), "election": election.as_str(), "leader": leader_obj }))
            }
            // The same term with new metadata: the leader proclaimed it.
            (Some(l), false) if last.as_ref().is_some_and(|p| p.holder == l.holder && p.token == l.token) => {
                format!(
                    "{now}  {election}  leader {} (token {}) published {}",
                    l.holder,
                    l.token,
                    printable(&l.metadata)
                )
            }
            (Some(l), false) => format!("{now}  {election}  leader {} (token {})", l.holder, l.token),
            (None, false) => format!("{now}  {election}  no leader"),
        };
        let mut out = std::io::stdout().lock();
        writeln!(out, "{line}")?;
        out.flush()?;
        last = leader;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_lines_carry_no_terminal_controls_and_read_back_the_same() {
        let hostile = "a\u{9b}31m\u{1b}]0;title\u{7}\u{202e}hs.a\u{2066}\u{85}\u{7f}é😀";
        let v = json!({ "metadata": hostile, hostile: [hostile] });
        let line = json_line(&v);
        assert!(!line.chars().any(unsafe_char), "{line:?}");
        assert!(line.contains("\\u009b") && line.contains("\\u202e") && line.contains("é😀"), "{line}");
        assert_eq!(serde_json::from_str::<Value>(&line).unwrap(), v);
        let plain = json!({ "metadata": "plain é" });
        assert_eq!(json_line(&plain), plain.to_string());
    }

    #[test]
    fn status_json_has_the_documented_shape() {
        let v = status_json("a/b", None);
        assert_eq!(v, json!({"election": "a/b", "leader": null}));
    }

    #[test]
    fn a_leader_without_its_record_has_the_same_fields() {
        let rec = LeaseRecord {
            election: ElectionName::new("a").unwrap(),
            holder: tenure::HolderId::new("h").unwrap(),
            token: tenure::FencingToken(7),
            revision: tenure::store::Revision(1),
            ttl: Duration::from_secs(1),
            acquired_at: None,
            renewed_at: None,
            remaining: None,
            evicted: false,
            metadata: b"m".to_vec(),
        };
        let leader = Leader { holder: rec.holder.clone(), token: rec.token, metadata: rec.metadata.clone() };
        assert_eq!(leader_json(&rec), leader_json_without_record(&leader));
    }
}
