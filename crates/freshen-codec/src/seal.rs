//! Positions that hold redacted values, sealed.
//!
//! freshen keeps some positions outside the process: a snapshot's resume key (the
//! primary key of the last row read) in the changefeed's store and in
//! `freshen_sink_snapshots`, served by `/changefeed/snapshot` and `/status`. Where a
//! `[[redact]]` rule hides one of the position's columns, the clear value must not land
//! there, but the position must still take a restart back to where it was. So it is
//! *sealed*: its text encrypted and authenticated (AES-256-GCM, ring's AEAD) with the
//! table and the columns as associated data, so a token moved to another table or key
//! shape does not open.
//!
//! The key: derived (HMAC-SHA-256 under a fixed label) from the hash key of the first
//! `hash` rule among the position's columns, so a restart with the same key opens it.
//! Where only `mask`, `truncate` or `drop` rules cover them there is no secret to
//! derive from: a key drawn at random once per process seals it, and a restart cannot
//! open it — the position is lost and the table is read again from its start (at least
//! once, never a clear value at rest).
//!
//! A token is `sealed1:` and the hex of the nonce, the ciphertext and the tag. Without
//! the key it tells nothing but the position's length.

use std::sync::OnceLock;

use hmac::{Hmac, Mac};
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};
use sha2::Sha256;

use crate::hex;

/// What a sealed position starts with (and its format's version).
pub const SEALED_PREFIX: &str = "sealed1:";

/// The label the sealing key is derived under: the hash key itself never encrypts.
const LABEL: &[u8] = b"freshen: sealed positions, v1";

/// The key a position is sealed under.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum SealKey {
    /// Derived from a `hash` rule's key: the same after a restart.
    Derived([u8; 32]),
    /// Drawn at random for this process (no rule over the columns has a secret).
    Process,
}

impl SealKey {
    /// The key derived from `secret` (the hash key of the first `hash` rule over the
    /// position's columns); without one, this process's.
    pub(crate) fn for_secret(secret: Option<&[u8]>) -> SealKey {
        secret.map_or(SealKey::Process, |k| SealKey::Derived(derive(k)))
    }

    fn bytes(self) -> Option<[u8; 32]> {
        match self {
            SealKey::Derived(k) => Some(k),
            SealKey::Process => process_key().copied(),
        }
    }
}

fn derive(key: &[u8]) -> [u8; 32] {
    // HMAC takes a key of any length: no error can happen.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).unwrap_or_else(|_| {
        unreachable!("HMAC accepts keys of every length");
    });
    mac.update(LABEL);
    mac.finalize().into_bytes().into()
}

/// This process's random key; `None` if the system has no randomness to give (then
/// nothing can be sealed, and nothing is kept: see [`seal`]).
fn process_key() -> Option<&'static [u8; 32]> {
    static KEY: OnceLock<Option<[u8; 32]>> = OnceLock::new();
    KEY.get_or_init(|| {
        let mut k = [0u8; 32];
        SystemRandom::new().fill(&mut k).ok().map(|()| k)
    })
    .as_ref()
}

/// What binds a token to its table and columns.
fn associated(schema: &str, table: &str, columns: &[&str]) -> Vec<u8> {
    let mut aad = Vec::new();
    for part in [schema, table].into_iter().chain(columns.iter().copied()) {
        aad.extend_from_slice(part.as_bytes());
        aad.push(0);
    }
    aad
}

fn aead(key: SealKey) -> Option<LessSafeKey> {
    let bytes = key.bytes()?;
    UnboundKey::new(&AES_256_GCM, &bytes)
        .ok()
        .map(LessSafeKey::new)
}

/// `position` sealed under `key` for `schema.table`'s `columns`. Never fails: when
/// the system gives no randomness, the token is the bare prefix, which opens to
/// nothing (the position is lost, never kept in clear).
pub(crate) fn seal(
    key: SealKey,
    schema: &str,
    table: &str,
    columns: &[&str],
    position: &[String],
) -> String {
    let mut nonce = [0u8; NONCE_LEN];
    let Some(k) = aead(key).filter(|_| SystemRandom::new().fill(&mut nonce).is_ok()) else {
        return SEALED_PREFIX.to_owned();
    };
    let mut data = serde_json::to_vec(position).unwrap_or_default();
    let aad = associated(schema, table, columns);
    if k.seal_in_place_append_tag(
        Nonce::assume_unique_for_key(nonce),
        Aad::from(&aad),
        &mut data,
    )
    .is_err()
    {
        return SEALED_PREFIX.to_owned();
    }
    let mut bytes = nonce.to_vec();
    bytes.extend_from_slice(&data);
    format!("{SEALED_PREFIX}{}", hex::encode(&bytes))
}

/// The position `token` holds, if `key` sealed it for `schema.table`'s `columns`.
pub(crate) fn open(
    key: SealKey,
    schema: &str,
    table: &str,
    columns: &[&str],
    token: &str,
) -> Option<Vec<String>> {
    let mut bytes = hex::decode(token.strip_prefix(SEALED_PREFIX)?)?;
    if bytes.len() < NONCE_LEN {
        return None;
    }
    let nonce = Nonce::try_assume_unique_for_key(&bytes[..NONCE_LEN]).ok()?;
    let k = aead(key)?;
    let aad = associated(schema, table, columns);
    let clear = k
        .open_in_place(nonce, Aad::from(&aad), &mut bytes[NONCE_LEN..])
        .ok()?;
    let position: Vec<String> = serde_json::from_slice(clear).ok()?;
    (position.len() == columns.len()).then_some(position)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keyed(k: &str) -> SealKey {
        SealKey::Derived(derive(k.as_bytes()))
    }

    fn pos(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_sealed_position_opens_only_with_its_key_table_and_columns() {
        let k = keyed("a key of sixteen bytes or more");
        let clear = pos(&["SSN-555-12-3456", "7"]);
        let t = seal(k, "public", "people", &["ssn", "n"], &clear);
        assert!(t.starts_with(SEALED_PREFIX), "{t}");
        assert!(!t.contains("555"), "{t}");
        assert_eq!(open(k, "public", "people", &["ssn", "n"], &t), Some(clear));
        let other = keyed("another key of sixteen bytes");
        assert_eq!(open(other, "public", "people", &["ssn", "n"], &t), None);
        assert_eq!(open(k, "public", "staff", &["ssn", "n"], &t), None);
        assert_eq!(open(k, "public", "people", &["n", "ssn"], &t), None);
        assert_eq!(
            open(SealKey::Process, "public", "people", &["ssn", "n"], &t),
            None
        );
    }

    #[test]
    fn sealing_twice_gives_two_tokens() {
        // A fresh nonce each time: equal positions are not told apart by their tokens.
        let k = keyed("a key of sixteen bytes or more");
        let a = seal(k, "s", "t", &["id"], &pos(&["1"]));
        let b = seal(k, "s", "t", &["id"], &pos(&["1"]));
        assert_ne!(a, b);
    }

    #[test]
    fn the_process_key_opens_what_it_sealed() {
        let t = seal(SealKey::Process, "s", "t", &["id"], &pos(&["x"]));
        assert_eq!(
            open(SealKey::Process, "s", "t", &["id"], &t),
            Some(pos(&["x"]))
        );
    }

    #[test]
    fn damaged_tokens_open_to_nothing() {
        let k = keyed("a key of sixteen bytes or more");
        let t = seal(k, "s", "t", &["id"], &pos(&["1"]));
        let mut flipped = t.clone().into_bytes();
        let last = flipped.len() - 1;
        flipped[last] = if flipped[last] == b'0' { b'1' } else { b'0' };
        let flipped = String::from_utf8(flipped).unwrap();
        for bad in [
            flipped.as_str(),
            "sealed1:",
            "sealed1:zz",
            "sealed1:abc",
            "1",
            &t[..t.len() - 2],
        ] {
            assert_eq!(open(k, "s", "t", &["id"], bad), None, "{bad}");
        }
    }

    #[test]
    fn a_secret_gives_a_derived_key_and_none_the_process_key() {
        assert!(SealKey::for_secret(None) == SealKey::Process);
        let k = "a key of sixteen bytes or more";
        assert!(SealKey::for_secret(Some(k.as_bytes())) == keyed(k));
    }
}
