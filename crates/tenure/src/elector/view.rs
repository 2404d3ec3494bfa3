//! What a candidate has seen of the election: the leader it reported, and when leases end.

use super::*;

/// A revision of a lease, and the earliest end the readings of it gave.
pub(super) type Reading = (crate::store::Revision, Instant);

/// Tracks the leader this candidate last reported, to emit each change once.
pub(super) struct View<'a> {
    pub(super) shared: &'a Shared,
    pub(super) leader: Option<Option<(HolderId, crate::FencingToken)>>,
    /// While following: when the last live lease seen would end, and when the store said
    /// there was none; how long the election then had no leader, once this one won.
    pub(super) lease_ends: Option<Instant>,
    pub(super) vacant_since: Option<Instant>,
    pub(super) takeover: Option<Duration>,
    /// The grant of the last live lease seen while following, and for each of its last
    /// few revisions when it would end as far as the readings tell (see [`View::ends`]).
    pub(super) seen: Option<(HolderId, crate::FencingToken, Vec<Reading>)>,
}

impl View<'_> {
    /// Another holder's live lease, seen while following: the election will have no
    /// leader once it ends, unless the store reports it gone sooner.
    pub(super) fn live(&mut self, rec: &LeaseRecord) {
        if rec.evicted {
            return;
        }
        self.lease_ends = Some(self.ends(rec));
        self.vacant_since = None;
    }

    /// When the lease `rec` ends, as far as this candidate can tell: the time left the
    /// store reported, counted from now. A reading tells the time left when the store
    /// made it, so the later it arrives the later the end it gives: a watch that catches
    /// up after a partition delivers the renewals it missed, each with a whole TTL left,
    /// after this candidate has read the latest one itself. Of the readings of one
    /// revision of a grant, whose end at the store is one, the earliest counts.
    pub(super) fn ends(&mut self, rec: &LeaseRecord) -> Instant {
        /// Revisions remembered per grant: enough for the renewals a catching-up watch
        /// delivers after a read, few enough to look through at each event.
        const REMEMBERED: usize = 8;
        let end = self.shared.clock.now() + rec.remaining.unwrap_or(rec.ttl);
        if crate::mutant("latest-reading-counts") {
            return end;
        }
        let same_grant = matches!(&self.seen, Some((h, t, _)) if *h == rec.holder && *t == rec.token);
        if !same_grant {
            self.seen = Some((rec.holder.clone(), rec.token, Vec::with_capacity(REMEMBERED)));
        }
        let Some((_, _, revisions)) = &mut self.seen else { return end };
        match revisions.iter_mut().find(|(r, _)| *r == rec.revision) {
            Some((_, earlier)) => {
                *earlier = (*earlier).min(end);
                *earlier
            }
            None => {
                if revisions.len() == REMEMBERED {
                    revisions.remove(0);
                }
                revisions.push((rec.revision, end));
                end
            }
        }
    }

    /// This candidate won: how long the election had no leader, as far as it saw.
    pub(super) fn won(&mut self) {
        let now = self.shared.clock.now();
        let ended = match (self.vacant_since, self.lease_ends) {
            (Some(v), _) => Some(v),
            (None, Some(end)) if end <= now => Some(end),
            _ => None,
        };
        self.takeover = ended.map(|e| now.saturating_duration_since(e));
        self.lease_ends = None;
        self.vacant_since = None;
    }

    pub(super) fn saw(&mut self, leader: Option<Leader>) {
        if self.shared.cfg.holders > 1 {
            // Several lead: there is no one leader to tell of.
            return;
        }
        let key = leader.as_ref().map(|l| (l.holder.clone(), l.token));
        if self.leader.as_ref() != Some(&key) {
            self.leader = Some(key);
            self.shared.send_event(Event::LeaderChanged(leader));
        }
    }

    pub(super) fn saw_record(&mut self, rec: Option<&LeaseRecord>) {
        self.saw(rec.map(LeaseRecord::leader));
    }
}
