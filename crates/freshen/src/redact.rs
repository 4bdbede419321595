//! Connection strings with their secrets hidden, for logs, errors and `check` output.
//!
//! One routine for every adapter, so that PostgreSQL, Kafka, Pulsar and MySQL settings
//! are shown the same way and a new form of secret is fixed once. Pure string code.
//!
//! The rules, in doubt redacting more:
//!
//! - **URLs** (`scheme://user:password@host:port/path?query`): everything between the
//!   first `:` after the user name and the *last* `@` is replaced, so a password holding
//!   an unencoded `@`, `:` or `/` is hidden whole. When the text before that `@` does not
//!   look like `user[:password]` (it holds `/`, `?`, `#`, `&` or `=`), all of it is
//!   replaced. Without any `@`, a "port" that is not a number (`app:secret/db`, a
//!   forgotten host) is replaced.
//! - **Query parameters** and **`key=value` strings** (libpq's form, quoted values
//!   too): a value is shown only when its name is on a short list of names known to hold
//!   no secret ([`SAFE_PARAMETERS`]: `sslmode`, `host`, `port`, `connect_timeout`, …).
//!   Every other value is replaced — `password`, but also `passwd`, `pwd`, `sslpassword`,
//!   `token`, and whatever misspelling comes next: an allow-list cannot miss a name
//!   nobody thought of, where a deny-list of "pass", "secret", "token", "key" would show
//!   `?pw=…` or `?auth=…`. A name that does not look like a name (it may be a pasted
//!   secret) is replaced as well.
//! - Anything else that is not empty (no `://` and no `=`) is replaced whole.

use std::fmt;

/// Parameter names whose values are shown: connection settings that never hold a
/// secret (libpq's, MySQL's and the brokers' common ones). Compared ignoring case.
pub const SAFE_PARAMETERS: &[&str] = &[
    "application_name",
    "channel_binding",
    "charset",
    "compression",
    "connect_timeout",
    "database",
    "dbname",
    "gssencmode",
    "host",
    "hostaddr",
    "keepalives",
    "keepalives_count",
    "keepalives_idle",
    "keepalives_interval",
    "load_balance_hosts",
    "port",
    "replication",
    "socket",
    "ssl-mode",
    "sslcert",
    "sslcompression",
    "sslkey",
    "sslmode",
    "sslnegotiation",
    "sslrootcert",
    "target_session_attrs",
    "tcp_user_timeout",
    "user",
    "username",
];

/// What replaces a secret.
pub const MASK: &str = "***";

/// Whether `name`'s value may be shown.
pub fn is_safe_parameter(name: &str) -> bool {
    SAFE_PARAMETERS.iter().any(|s| s.eq_ignore_ascii_case(name))
}

/// Whether `name` looks like a parameter name (so that showing it reveals no secret):
/// ASCII letters, digits, `_`, `-` and `.`, at most 40 bytes, starting with a letter.
pub(crate) fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 40
        && name.starts_with(|c: char| c.is_ascii_alphabetic())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// A parameter name fit for a message: the name itself when it looks like one, else a
/// placeholder (a "name" that is not one may be a secret pasted in the wrong place).
pub fn parameter_name(name: &str) -> &str {
    if is_plain_name(name) {
        name
    } else {
        "(a parameter whose name is not shown)"
    }
}

/// `url` (a connection URL or a `key=value` string) with every secret replaced by
/// [`MASK`]; see the module docs for the rules.
///
/// ```
/// use freshen::redact_url;
/// assert_eq!(redact_url("postgres://app:p@ss@db/app"), "postgres://app:***@db/app");
/// assert_eq!(redact_url("postgres://app@db/app?passwd=x&sslmode=require"), "postgres://app@db/app?passwd=***&sslmode=require");
/// assert_eq!(redact_url("host=db password='a b' user=app"), "host=db password=*** user=app");
/// ```
pub fn redact_url(url: &str) -> String {
    if let Some(i) = url.find("://") {
        let (scheme, rest) = (&url[..i], &url[i + 3..]);
        return format!("{scheme}://{}", redact_after_scheme(rest));
    }
    if url.trim().is_empty() {
        return url.to_owned();
    }
    if url.contains('=') {
        return redact_key_values(url);
    }
    MASK.to_owned()
}

fn redact_after_scheme(rest: &str) -> String {
    let (userinfo, tail) = match rest.rfind('@') {
        Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
        None => (None, rest),
    };
    let mut out = String::with_capacity(rest.len());
    if let Some(ui) = userinfo {
        if ui.contains(['/', '?', '#', '&', '=']) {
            // Not `user[:password]`: the `@` may belong to a query value, or the
            // password may hold a delimiter. Show none of it.
            out.push_str(MASK);
        } else if let Some((user, _)) = ui.split_once(':') {
            out.push_str(user);
            out.push(':');
            out.push_str(MASK);
        } else {
            out.push_str(ui);
        }
        out.push('@');
    }
    let (before_query, query) = match tail.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (tail, None),
    };
    let (authority, path) = match before_query.find('/') {
        Some(i) => before_query.split_at(i),
        None => (before_query, ""),
    };
    if userinfo.is_none() {
        out.push_str(&redact_authority(authority));
    } else {
        out.push_str(authority);
    }
    out.push_str(path);
    if let Some(q) = query {
        out.push('?');
        out.push_str(&redact_query(q));
    }
    out
}

/// `host:port[,host:port]` without credentials: a "port" that is not a number may be a
/// password whose `@host` was forgotten.
fn redact_authority(authority: &str) -> String {
    authority
        .split(',')
        .map(|hp| {
            let port_start = if hp.starts_with('[') {
                hp.find("]:").map(|i| i + 1)
            } else {
                hp.find(':')
            };
            match port_start {
                Some(i) if !hp[i + 1..].bytes().all(|b| b.is_ascii_digit()) => {
                    format!("{}:{MASK}", &hp[..i])
                }
                _ => hp.to_owned(),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

fn redact_query(query: &str) -> String {
    query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((k, _)) if is_safe_parameter(&decode_lossy(k)) => pair.to_owned(),
            Some((k, _)) if is_plain_name(k) => format!("{k}={MASK}"),
            Some(_) => format!("{MASK}={MASK}"),
            None if pair.is_empty() || is_safe_parameter(pair) => pair.to_owned(),
            None => MASK.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("&")
}

/// Percent-decoding that never fails (for comparing names only).
fn decode_lossy(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = s.get(i + 1..i + 3).filter(|_| b[i] == b'%');
        match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
            Some(v) => {
                out.push(v);
                i += 3;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// libpq's `key = value` list: values may be single-quoted with `\'` and `\\` escapes.
/// Unsafe values are masked; from a token that does not parse on, everything is.
fn redact_key_values(s: &str) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut rest = s.trim_start();
    while !rest.is_empty() {
        let Some(eq) = rest.find('=') else {
            out.push(MASK.to_owned());
            break;
        };
        let key = rest[..eq].trim();
        if key.is_empty() || key.contains(char::is_whitespace) {
            out.push(MASK.to_owned());
            break;
        }
        let after = rest[eq + 1..].trim_start();
        let (value, next) = match after.strip_prefix('\'') {
            Some(quoted) => match closing_quote(quoted) {
                Some(end) => (&after[..end + 2], &quoted[end + 1..]),
                None => {
                    // An unclosed quote: the value runs to the end, and is hidden.
                    out.push(format!("{}={MASK}", parameter_name(key)));
                    break;
                }
            },
            None => {
                let end = after.find(char::is_whitespace).unwrap_or(after.len());
                (&after[..end], &after[end..])
            }
        };
        if is_safe_parameter(key) {
            out.push(format!("{key}={value}"));
        } else if is_plain_name(key) {
            out.push(format!("{key}={MASK}"));
        } else {
            out.push(format!("{MASK}={MASK}"));
        }
        rest = next.trim_start();
    }
    out.join(" ")
}

/// The index of the `'` that closes a quoted value (`s` starts after the opening one).
fn closing_quote(s: &str) -> Option<usize> {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\\' => i += 2,
            b'\'' => return Some(i),
            _ => i += 1,
        }
    }
    None
}

/// `text` (an error message, a log line) with every connection URL in it, and every
/// `name=value` whose name suggests a secret, redacted. For text that may quote a
/// connection string among other words; a known connection string goes to
/// [`redact_url`] instead.
pub fn redact_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut first = true;
    for word in text.split(' ') {
        if !first {
            out.push(' ');
        }
        first = false;
        out.push_str(&redact_word(word));
    }
    out
}

fn redact_word(word: &str) -> String {
    if let Some(i) = word.find("://") {
        // Keep quotes or brackets around a URL.
        let start = word[..i]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
            .map_or(0, |j| j + 1);
        let end = word
            .rfind(|c: char| !matches!(c, '"' | '\'' | ')' | ']' | ',' | ';' | '`'))
            .map_or(word.len(), |j| j + 1);
        if start < end {
            return format!(
                "{}{}{}",
                &word[..start],
                redact_url(&word[start..end]),
                &word[end..]
            );
        }
    }
    if let Some((k, _)) = word.split_once('=') {
        let name = k.trim_start_matches(|c: char| !c.is_ascii_alphanumeric());
        if looks_secret(name) {
            return format!("{k}={MASK}");
        }
    }
    word.to_owned()
}

/// A deny-list for free text, where most `a=b` are harmless.
fn looks_secret(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    [
        "pass",
        "pwd",
        "secret",
        "token",
        "key",
        "auth",
        "credential",
    ]
    .iter()
    .any(|s| n.contains(s))
}

/// At most `max` bytes of `s`, cut at a character boundary: text from outside (a
/// message that failed to decode, a server's error) is bounded before it reaches a log
/// or a report.
pub fn clip(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// A connection URL that may hold a password: never printed (`Debug` and `Display`
/// show the URL with the password replaced by `***`), never serialized. One type
/// for every crate, so a URL read from configuration cannot reach a log by accident.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretUrl(String);

impl SecretUrl {
    /// Wraps a URL.
    pub fn new(url: impl Into<String>) -> SecretUrl {
        SecretUrl(url.into())
    }

    /// The URL itself, password included: pass it to a client, never to a log.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The URL with any password replaced by `***` ([`redact_url`]).
    pub fn redacted(&self) -> String {
        redact_url(&self.0)
    }
}

impl fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.redacted())
    }
}

impl fmt::Display for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every form a secret took in the reports, and what must be shown instead.
    const CASES: &[(&str, &str)] = &[
        (
            "postgres://app:hunter2@db:5432/app",
            "postgres://app:***@db:5432/app",
        ),
        ("postgres://app:p@ss@db/app", "postgres://app:***@db/app"),
        ("postgres://app:a:b:c@db/app", "postgres://app:***@db/app"),
        ("postgres://app:a/b@db/app", "postgres://***@db/app"),
        ("postgres://app:a?b@db/app", "postgres://***@db/app"),
        ("postgres://app@db/app", "postgres://app@db/app"),
        ("postgres://db/app", "postgres://db/app"),
        ("postgres://[::1]:5432/app", "postgres://[::1]:5432/app"),
        (
            "postgres://app@db/app?password=hunter2",
            "postgres://app@db/app?password=***",
        ),
        (
            "postgres://app@db/app?passwd=hunter2&sslmode=require",
            "postgres://app@db/app?passwd=***&sslmode=require",
        ),
        (
            "postgres://app@db/app?pass=hunter2",
            "postgres://app@db/app?pass=***",
        ),
        (
            "postgres://app@db/app?sslpassword=hunter2",
            "postgres://app@db/app?sslpassword=***",
        ),
        (
            "postgres://app@db/app?PASSWORD=hunter2",
            "postgres://app@db/app?PASSWORD=***",
        ),
        ("postgres://app@db/app?hunter2", "postgres://app@db/app?***"),
        (
            "postgres://app@db/app?hunter2!=x",
            "postgres://app@db/app?***=***",
        ),
        (
            "postgres://db/app?application_name=a@hunter2",
            "postgres://***@hunter2",
        ),
        ("postgres://app:hunter2/app", "postgres://app:***/app"),
        ("postgres://app:hunter2", "postgres://app:***"),
        (
            "postgres://db/app?connect_timeout=5&host=/tmp",
            "postgres://db/app?connect_timeout=5&host=/tmp",
        ),
        (
            "host=db password=hunter2 user=app",
            "host=db password=*** user=app",
        ),
        (
            "host=db password='hun ter2' user=app",
            "host=db password=*** user=app",
        ),
        (
            r"host=db password = 'it\'s hunter2' port=5432",
            "host=db password=*** port=5432",
        ),
        ("host=db password='hunter2", "host=db password=***"),
        ("host=db passwd=hunter2", "host=db passwd=***"),
        ("host=db hunter2", "host=db ***"),
        ("hunter2", "***"),
        ("", ""),
        ("pulsar://h:6650?token=hunter2", "pulsar://h:6650?token=***"),
    ];

    #[test]
    fn every_form_of_secret_is_hidden() {
        for (url, want) in CASES {
            let got = redact_url(url);
            assert_eq!(&got, want, "redacting {url:?}");
            assert!(
                !got.contains("hunter2") || want.contains("hunter2"),
                "{got}"
            );
        }
    }

    #[test]
    fn text_hides_urls_and_secret_looking_pairs_only() {
        assert_eq!(
            redact_text("cannot reach \"postgres://app:hunter2@db/x\": refused"),
            "cannot reach \"postgres://app:***@db/x\": refused"
        );
        assert_eq!(
            redact_text("wal_level=replica sasl.password=hunter2 api_key=x"),
            "wal_level=replica sasl.password=*** api_key=***"
        );
    }

    #[test]
    fn names_that_may_be_secrets_are_not_shown() {
        assert_eq!(parameter_name("passwd"), "passwd");
        assert_ne!(parameter_name("hunter2!"), "hunter2!");
        assert_ne!(parameter_name(&"x".repeat(41)), "x".repeat(41));
    }
}
