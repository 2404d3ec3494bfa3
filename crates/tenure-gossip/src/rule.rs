//! The winner rule.

/// One candidate's bid: its Lamport clock when it stood, and its worker id.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Bid {
    /// The candidate's Lamport clock when it announced itself.
    pub clock: u64,
    /// The candidate's worker id (`hostname.pid` by default).
    pub worker: String,
}

/// The winner among `bids`: the lowest clock, ties broken by the lower worker id (compared
/// byte by byte). `None` when there are no bids.
///
/// Every worker applies this rule to the same set of announcements, so every worker
/// reaches the same winner.
pub fn winner<'a>(bids: impl IntoIterator<Item = &'a Bid>) -> Option<&'a Bid> {
    bids.into_iter().min_by(|a, b| (a.clock, a.worker.as_bytes()).cmp(&(b.clock, b.worker.as_bytes())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bid(clock: u64, worker: &str) -> Bid {
        Bid { clock, worker: worker.into() }
    }

    #[test]
    fn the_lowest_clock_wins() {
        let bids = [bid(9, "a.1"), bid(4, "z.9"), bid(5, "b.2")];
        assert_eq!(winner(&bids).unwrap().worker, "z.9");
    }

    #[test]
    fn equal_clocks_are_broken_by_worker_id() {
        let bids = [bid(4, "host-b.10"), bid(4, "host-a.20"), bid(4, "host-a.3")];
        // Byte order: "host-a.20" < "host-a.3" < "host-b.10".
        assert_eq!(winner(&bids).unwrap().worker, "host-a.20");
    }

    #[test]
    fn the_order_of_the_announcements_does_not_matter() {
        let mut bids = vec![bid(7, "c.3"), bid(3, "d.4"), bid(3, "a.1"), bid(12, "b.2")];
        let first = winner(&bids).cloned();
        for _ in 0..bids.len() {
            bids.rotate_left(1);
            assert_eq!(winner(&bids).cloned(), first);
        }
        bids.reverse();
        assert_eq!(winner(&bids).cloned(), first);
        assert_eq!(first.unwrap().worker, "a.1");
    }

    #[test]
    fn no_bids_no_winner() {
        assert_eq!(winner(&[]), None);
        assert_eq!(winner(&[bid(1, "only.1")]).unwrap().worker, "only.1");
    }
}
