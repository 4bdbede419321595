//! A bounds-checked reader over one event's bytes: every read says how much it needs
//! first, so a truncated or lying event is an error, never a panic.

use super::DecodeError;

/// Reads little-endian integers and slices off a byte slice, front to back.
#[derive(Debug, Clone)]
pub(crate) struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Cursor<'a> {
        Cursor { buf, pos: 0 }
    }

    /// Bytes not read yet.
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.remaining() == 0
    }

    /// The next `n` bytes.
    pub(crate) fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
        if n > self.remaining() {
            return Err(DecodeError::truncated(what, n, self.remaining()));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    /// Everything left.
    pub(crate) fn rest(&mut self) -> &'a [u8] {
        let s = &self.buf[self.pos..];
        self.pos = self.buf.len();
        s
    }

    pub(crate) fn u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        Ok(self.take(1, what)?[0])
    }

    /// An unsigned little-endian integer of `n` (1–8) bytes.
    pub(crate) fn uint(&mut self, n: usize, what: &'static str) -> Result<u64, DecodeError> {
        let b = self.take(n, what)?;
        Ok(le(b))
    }

    pub(crate) fn u16(&mut self, what: &'static str) -> Result<u16, DecodeError> {
        Ok(self.uint(2, what)? as u16)
    }

    pub(crate) fn u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        Ok(self.uint(4, what)? as u32)
    }

    pub(crate) fn u64(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        self.uint(8, what)
    }

    /// A length-encoded integer (the client protocol's `int<lenenc>`).
    pub(crate) fn lenenc(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        match self.u8(what)? {
            n @ 0..=0xfa => Ok(u64::from(n)),
            0xfc => self.uint(2, what),
            0xfd => self.uint(3, what),
            0xfe => self.uint(8, what),
            _ => Err(DecodeError::new(format!(
                "{what}: invalid length-encoded integer"
            ))),
        }
    }

    /// A length-encoded count that must fit what is left (each unit taking at least
    /// `unit` bytes), so that a lying count cannot make anyone allocate for it.
    pub(crate) fn count(&mut self, unit: usize, what: &'static str) -> Result<usize, DecodeError> {
        let n = self.lenenc(what)?;
        let fits = (n as u128) * (unit.max(1) as u128) <= self.remaining() as u128;
        if !fits {
            return Err(DecodeError::new(format!(
                "{what}: count {n} does not fit the {} bytes left",
                self.remaining()
            )));
        }
        Ok(n as usize)
    }

    /// A length-encoded string.
    pub(crate) fn lenenc_bytes(&mut self, what: &'static str) -> Result<&'a [u8], DecodeError> {
        let n = self.lenenc(what)?;
        let n = usize::try_from(n).map_err(|_| DecodeError::new(format!("{what}: too long")))?;
        self.take(n, what)
    }
}

/// Little-endian bytes as an integer (at most 8 bytes are read).
pub(crate) fn le(b: &[u8]) -> u64 {
    b.iter()
        .take(8)
        .rev()
        .fold(0u64, |acc, &x| (acc << 8) | u64::from(x))
}

/// Big-endian bytes as an integer (at most 8 bytes are read).
pub(crate) fn be(b: &[u8]) -> u64 {
    b.iter()
        .take(8)
        .fold(0u64, |acc, &x| (acc << 8) | u64::from(x))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_are_bounded() {
        let mut c = Cursor::new(&[1, 2, 3]);
        assert_eq!(c.u16("a").unwrap(), 0x0201);
        assert!(c.u16("b").is_err());
        assert_eq!(c.u8("c").unwrap(), 3);
        assert!(c.is_empty());
    }

    #[test]
    fn lenenc_forms() {
        assert_eq!(Cursor::new(&[0xfa]).lenenc("x").unwrap(), 250);
        assert_eq!(Cursor::new(&[0xfc, 1, 1]).lenenc("x").unwrap(), 257);
        assert_eq!(Cursor::new(&[0xfd, 0, 0, 1]).lenenc("x").unwrap(), 65536);
        assert!(Cursor::new(&[0xfe, 1]).lenenc("x").is_err());
        assert!(Cursor::new(&[0xff]).lenenc("x").is_err());
    }

    #[test]
    fn counts_must_fit() {
        let mut c = Cursor::new(&[0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0]);
        assert!(c.count(1, "columns").is_err());
        assert_eq!(Cursor::new(&[2, 0, 0]).count(1, "n").unwrap(), 2);
    }

    #[test]
    fn endianness() {
        assert_eq!(le(&[1, 2]), 0x0201);
        assert_eq!(be(&[1, 2]), 0x0102);
    }
}
