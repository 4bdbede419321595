//! Lower-case hex, for HMAC values and sealed positions.

/// Lower-case hex of `bytes`.
pub(crate) fn encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from_digit(u32::from(b >> 4), 16).unwrap_or('0'));
        out.push(char::from_digit(u32::from(b & 0xf), 16).unwrap_or('0'));
    }
    out
}

/// The bytes `text` spells in hex (either case); `None` for anything else.
pub(crate) fn decode(text: &str) -> Option<Vec<u8>> {
    // `from_str_radix` alone would also take a sign ("+1").
    if !text.len().is_multiple_of(2) || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_refuses_what_is_not_hex() {
        let bytes = [0u8, 0x0f, 0xa5, 0xff];
        assert_eq!(encode(&bytes), "000fa5ff");
        assert_eq!(decode("000fa5ff").as_deref(), Some(&bytes[..]));
        for bad in ["0", "zz", "+1"] {
            assert_eq!(decode(bad), None, "{bad}");
        }
    }
}
