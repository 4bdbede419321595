//! The cursor of one table: the pure logic lives in the core ([`freshen::cursor`]),
//! shared with the MySQL incremental source; PostgreSQL adds the transaction-id horizon
//! (`pg_current_snapshot()`) and the 64-bit writer id of a row read here.

pub use freshen::cursor::{Cursor, Horizon, Position, Reread};

/// A row's full (64-bit) transaction id from its 32-bit `xmin`, given a full id at or
/// after it (`reference`, the snapshot's `xmax`): the id closest below the reference.
/// A row older than 2^32 transactions maps to a newer id than its own, which at worst
/// hands it over again.
pub fn full_xid(reference: u64, xid32: u32) -> u64 {
    let back = (reference as u32).wrapping_sub(xid32);
    reference.saturating_sub(u64::from(back))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_ids_are_the_closest_below_the_reference() {
        assert_eq!(full_xid(1000, 990), 990);
        assert_eq!(full_xid(1000, 1000), 1000);
        // Epoch 1: 2^32 + 5 as reference; xid32 4294967290 is from epoch 0.
        let r = (1u64 << 32) + 5;
        assert_eq!(full_xid(r, 4_294_967_290), 4_294_967_290);
        assert_eq!(full_xid(r, 3), (1u64 << 32) + 3);
        assert_eq!(full_xid(10, 20), 0, "never below zero");
    }
}
