//! 64-bit transaction ids from pgoutput's 32-bit ones, and commit timestamps.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Extends 32-bit xids to `xid8` (epoch and xid), given a recent full xid as reference.
///
/// PostgreSQL keeps every live xid within 2^31 of the next one, so the full xid is the
/// one closest to the reference. The reference follows the newest xid seen, so the
/// epoch is tracked across wraparound for as long as the stream runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct XidClock {
    reference: u64,
}

impl XidClock {
    /// `next_full_xid`: `pg_snapshot_xmax(pg_current_snapshot())` at connect time.
    pub(crate) fn new(next_full_xid: u64) -> XidClock {
        XidClock {
            reference: next_full_xid,
        }
    }

    pub(crate) fn extend(&mut self, xid: u32) -> u64 {
        let diff = i64::from(xid.wrapping_sub(self.reference as u32) as i32);
        let full = (self.reference as i64).saturating_add(diff);
        if full < 0 {
            // Before the first epoch: the xid is its own full value.
            return u64::from(xid);
        }
        let full = full as u64;
        self.reference = self.reference.max(full);
        full
    }
}

/// Seconds from the Unix epoch to PostgreSQL's (2000-01-01 UTC).
const PG_EPOCH_UNIX_SECS: u64 = 946_684_800;

/// A pgoutput timestamp (microseconds since 2000-01-01 UTC) as a `SystemTime`.
pub(crate) fn pg_time(micros: i64) -> SystemTime {
    let epoch = UNIX_EPOCH + Duration::from_secs(PG_EPOCH_UNIX_SECS);
    if micros >= 0 {
        epoch + Duration::from_micros(micros as u64)
    } else {
        epoch
            .checked_sub(Duration::from_micros(micros.unsigned_abs()))
            .unwrap_or(UNIX_EPOCH)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const E: u64 = 1 << 32;

    #[test]
    fn same_epoch() {
        let mut c = XidClock::new(5 * E + 1000);
        assert_eq!(c.extend(990), 5 * E + 990);
        assert_eq!(c.extend(1010), 5 * E + 1010);
    }

    #[test]
    fn across_wraparound() {
        let mut c = XidClock::new(5 * E + 0xFFFF_FF00);
        assert_eq!(c.extend(0xFFFF_FFF0), 5 * E + 0xFFFF_FFF0);
        assert_eq!(c.extend(10), 6 * E + 10, "wrapped into the next epoch");
        // An older transaction from before the wrap still maps to the old epoch.
        assert_eq!(c.extend(0xFFFF_FFF5), 5 * E + 0xFFFF_FFF5);
        // The reference followed the newest: far later xids keep the new epoch.
        assert_eq!(c.extend(2_000_000_000), 6 * E + 2_000_000_000);
    }

    #[test]
    fn epoch_zero_never_goes_negative() {
        let mut c = XidClock::new(750);
        assert_eq!(c.extend(0xFFFF_FF00), 0xFFFF_FF00);
        assert_eq!(c.extend(740), 740);
    }

    #[test]
    fn timestamps() {
        assert_eq!(pg_time(0), UNIX_EPOCH + Duration::from_secs(946_684_800));
        assert_eq!(
            pg_time(-1_000_000),
            UNIX_EPOCH + Duration::from_secs(946_684_799)
        );
    }
}
