//! `Lsn`: a position in PostgreSQL's write-ahead log.

use std::fmt;
use std::str::FromStr;

/// A position in the write-ahead log, shown as PostgreSQL does (`16/B374D848`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Lsn(pub u64);

impl Lsn {
    /// The invalid position `0/0`.
    pub const ZERO: Lsn = Lsn(0);
}

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xFFFF_FFFF)
    }
}

/// A string that is not an LSN.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseLsnError(String);

impl fmt::Display for ParseLsnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not a WAL position (expected HEX/HEX): {:?}", self.0)
    }
}

impl std::error::Error for ParseLsnError {}

impl FromStr for Lsn {
    type Err = ParseLsnError;

    fn from_str(s: &str) -> Result<Lsn, ParseLsnError> {
        let err = || ParseLsnError(s.to_owned());
        let (hi, lo) = s.trim().split_once('/').ok_or_else(err)?;
        let hi = u32::from_str_radix(hi, 16).map_err(|_| err())?;
        let lo = u32::from_str_radix(lo, 16).map_err(|_| err())?;
        Ok(Lsn((u64::from(hi) << 32) | u64::from(lo)))
    }
}

impl From<u64> for Lsn {
    fn from(v: u64) -> Lsn {
        Lsn(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_postgres_text() {
        let l: Lsn = "16/B374D848".parse().unwrap();
        assert_eq!(l.0, 0x16_B374_D848);
        assert_eq!(l.to_string(), "16/B374D848");
        assert_eq!(Lsn::ZERO.to_string(), "0/0");
        assert!("16-B3".parse::<Lsn>().is_err());
        assert!("x/1".parse::<Lsn>().is_err());
    }
}
