//! Bearer tokens: reading one from a request and comparing it with a configured secret.

use axum::http::{HeaderMap, header};

/// The token of an `Authorization: Bearer <token>` header (the scheme in any case).
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Whether `presented` equals `secret`, compared without an early exit so that the time
/// taken does not reveal how much of a guess was right.
pub fn same_secret(presented: &[u8], secret: &[u8]) -> bool {
    presented.len() == secret.len()
        && presented
            .iter()
            .zip(secret)
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_bearer_scheme_only() {
        let mut h = HeaderMap::new();
        assert_eq!(bearer(&h), None);
        h.insert(header::AUTHORIZATION, "Bearer  s3cret ".parse().unwrap());
        assert_eq!(bearer(&h), Some("s3cret"));
        h.insert(header::AUTHORIZATION, "bearer s3cret".parse().unwrap());
        assert_eq!(bearer(&h), Some("s3cret"));
        h.insert(header::AUTHORIZATION, "Basic czNjcmV0".parse().unwrap());
        assert_eq!(bearer(&h), None);
    }

    #[test]
    fn compares_whole_secrets() {
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"abd", b"abc"));
        assert!(!same_secret(b"ab", b"abc"));
        assert!(!same_secret(b"", b"abc"));
    }
}
