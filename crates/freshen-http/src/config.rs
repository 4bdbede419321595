//! What a listener is allowed to do, and the bounds every setting is checked against.

use std::time::Duration;

/// Bounds of the settings, for the configuration readers that check them.
pub mod limits {
    use std::time::Duration;

    /// The shortest header timeout: slower clients exist (mobile, proxies).
    pub const MIN_HEADER_TIMEOUT: Duration = Duration::from_secs(1);
    /// The longest header timeout: past this a slow client holds a connection for long
    /// enough that a few thousand of them exhaust descriptors.
    pub const MAX_HEADER_TIMEOUT: Duration = Duration::from_secs(300);
    /// The shortest request timeout.
    pub const MIN_REQUEST_TIMEOUT: Duration = Duration::from_secs(1);
    /// The longest request timeout: an hour, far above any non-streaming request.
    pub const MAX_REQUEST_TIMEOUT: Duration = Duration::from_secs(3600);
    /// The most connections one listener may serve at once: each holds a descriptor,
    /// and the process's limit is usually 1024 to 65536.
    pub const MAX_CONNECTIONS: usize = 65_536;
}

/// One listener's hardening: what [`serve`](crate::serve) is built with. Plain data;
/// [`ListenerConfig::new`] gives the defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerConfig {
    /// Which server this is, in log lines (`"metrics"`, `"changefeed"`).
    pub name: &'static str,
    /// Host names served besides `localhost` and IP addresses (the port, if any, is
    /// ignored). Checked on loopback listeners always, on others when not empty.
    pub allowed_hosts: Vec<String>,
    /// Origins (`scheme://host[:port]`, or `*` for any) whose pages may open a
    /// WebSocket or send a non-simple request, besides the server's own.
    pub allowed_origins: Vec<String>,
    /// How long a connection may take to send a request's headers, counted from when
    /// the server starts waiting for them: also how long an idle kept-alive connection
    /// stays open (default 10 s).
    pub header_timeout: Duration,
    /// How long a handler may take to produce its response, when set (default 30 s;
    /// `None` leaves it to the application, see [`with_request_timeout`](crate::with_request_timeout)).
    pub request_timeout: Option<Duration>,
    /// Most connections served at once (default 256).
    pub max_connections: usize,
}

impl ListenerConfig {
    /// The defaults, for the server called `name`.
    pub fn new(name: &'static str) -> ListenerConfig {
        ListenerConfig {
            name,
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
            header_timeout: Duration::from_secs(10),
            request_timeout: Some(Duration::from_secs(30)),
            max_connections: 256,
        }
    }
}

/// What is wrong with `name` as an entry of `allowed_hosts`, if anything: a host name
/// or address without scheme, path or port.
pub fn host_problem(name: &str) -> Option<String> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name.bytes().all(|b| {
            b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b':' | b'[' | b']')
        })
        && !name.contains("://");
    (!ok).then(|| {
        format!(
            "{name:?} is not a host name (write e.g. \"feed.internal\", without scheme or port)"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_are_checked() {
        assert!(host_problem("feed.internal").is_none());
        assert!(host_problem("[::1]").is_none());
        assert!(host_problem("http://x").is_some());
        assert!(host_problem("a/b").is_some());
        assert!(host_problem("").is_some());
    }
}
