//! A lease kept as one value, as the key-value stores keep it (etcd, NATS JetStream KV).

use std::time::{Duration, UNIX_EPOCH};

use crate::name::HolderId;
use crate::record::LeaseRecord;

/// A lease as a key-value store keeps it in one value: the header line
/// `tenure1 HOLDER TTL_MS ACQUIRED_MS EVICTED[ TOKEN]`, then the metadata's raw bytes.
/// Holder ids hold no space or line break, so the header splits cleanly. Fields after
/// these, which a later version may add, are passed over.
///
/// `ACQUIRED_MS` is the grant's time in milliseconds since the Unix epoch (0 where the
/// store dates grants itself) and `EVICTED` is `0` or `1`. A store that keeps the
/// fencing token outside the value (etcd: the key's creation revision) writes no `TOKEN`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredValue {
    /// Who holds the lease.
    pub holder: HolderId,
    /// The TTL of the grant or its last renewal.
    pub ttl: Duration,
    /// When the term was granted, in milliseconds since the Unix epoch.
    pub acquired_ms: u64,
    /// Whether the lease was evicted after its term.
    pub evicted: bool,
    /// The fencing token, for stores that keep it in the value.
    pub token: Option<u64>,
    /// What the holder publishes.
    pub metadata: Vec<u8>,
}

impl StoredValue {
    /// The value's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut header =
            format!("tenure1 {} {} {} {}", self.holder, self.ttl.as_millis(), self.acquired_ms, u8::from(self.evicted));
        if let Some(t) = self.token {
            header.push_str(&format!(" {t}"));
        }
        header.push('\n');
        let mut v = header.into_bytes();
        v.extend_from_slice(&self.metadata);
        v
    }

    /// The value `raw` holds, or `None` if it is not one (another program's data, a
    /// damaged value).
    pub fn decode(raw: &[u8]) -> Option<Self> {
        let nl = raw.iter().position(|&b| b == b'\n')?;
        let header = std::str::from_utf8(&raw[..nl]).ok()?;
        let f: Vec<&str> = header.split(' ').collect();
        // Fields after these (from a later version) are passed over; a sixth that is not
        // a number is no token.
        let ["tenure1", holder, ttl, acquired, evicted, ref rest @ ..] = f[..] else { return None };
        let token = rest.first().and_then(|t| t.parse().ok());
        Some(Self {
            holder: HolderId::new(holder).ok()?,
            ttl: Duration::from_millis(ttl.parse().ok()?),
            acquired_ms: acquired.parse().ok()?,
            evicted: match evicted {
                "0" => false,
                "1" => true,
                _ => return None,
            },
            token,
            metadata: raw[nl + 1..].to_vec(),
        })
    }

    /// The value `rec` was read from, without a token.
    pub fn of(rec: &LeaseRecord) -> Self {
        Self {
            holder: rec.holder.clone(),
            ttl: rec.ttl,
            acquired_ms: rec
                .acquired_at
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_millis() as u64),
            evicted: rec.evicted,
            token: None,
            metadata: rec.metadata.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_and_other_data_is_refused() {
        let mut v = StoredValue {
            holder: HolderId::new("node-1").unwrap(),
            ttl: Duration::from_millis(1500),
            acquired_ms: 1_700_000_000_000,
            evicted: true,
            token: None,
            metadata: b"line one\nline two \x00\xff".to_vec(),
        };
        assert!(v.encode().starts_with(b"tenure1 node-1 1500 1700000000000 1\n"));
        assert_eq!(StoredValue::decode(&v.encode()), Some(v.clone()));
        v.token = Some(42);
        assert!(v.encode().starts_with(b"tenure1 node-1 1500 1700000000000 1 42\n"));
        assert_eq!(StoredValue::decode(&v.encode()), Some(v));
        for bad in
            [&b"other data"[..], b"tenure1 h 1 2 3\n", b"tenure2 h 1 2 0\n", b"tenure1 h 1 2\n", b"tenure1 h 1 2 0"]
        {
            assert_eq!(StoredValue::decode(bad), None, "{}", String::from_utf8_lossy(bad));
        }
        // Later fields are passed over; a sixth that is not a number is no token.
        for (raw, token) in
            [(&b"tenure1 h 1 2 0 x\n"[..], None), (b"tenure1 h 1 2 0 \n", None), (b"tenure1 h 1 2 0 7 x\n", Some(7))]
        {
            assert_eq!(StoredValue::decode(raw).map(|v| v.token), Some(token), "{}", String::from_utf8_lossy(raw));
        }
    }
}
