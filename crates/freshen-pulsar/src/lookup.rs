//! Finding the broker that serves a topic: connect to the service URL, then follow the
//! topic lookup's redirects.

use crate::Error;
use crate::connection::{Connection, addresses};
use crate::proto::{self, BaseCommand, CommandLookupTopic, kind};

/// Most redirects followed before giving up (a misconfigured cluster can loop).
const MAX_REDIRECTS: usize = 8;

/// A connection to the broker that owns `topic`.
pub(crate) async fn connect_for(
    url: &str,
    topic: &str,
    token: Option<&str>,
) -> Result<Connection, Error> {
    let hosts = addresses(url).map_err(|e| Error::Config(vec![format!("url {e}")]))?;
    let mut last = None;
    let mut found = None;
    for host in &hosts {
        match Connection::open(host, token).await {
            Ok(c) => {
                found = Some((c, host.clone()));
                break;
            }
            Err(e) => last = Some(e),
        }
    }
    let Some((mut conn, mut at)) = found else {
        return Err(last.unwrap_or_else(|| Error::Protocol("no broker address".into())));
    };
    let mut authoritative = false;
    for _ in 0..MAX_REDIRECTS {
        let answer = conn
            .request(|request_id| BaseCommand {
                lookup_topic: Some(CommandLookupTopic {
                    topic: topic.to_owned(),
                    request_id,
                    authoritative: Some(authoritative),
                }),
                ..BaseCommand::of(kind::LOOKUP)
            })
            .await?;
        let r = answer
            .lookup_topic_response
            .ok_or_else(|| Error::Protocol("a lookup answer without its body".into()))?;
        let target = r
            .broker_service_url
            .as_deref()
            .map(|u| addresses(u).map_err(Error::Protocol))
            .transpose()?
            .and_then(|a| a.into_iter().next());
        match r.response {
            Some(proto::LOOKUP_CONNECT) => {
                let stay = r.proxy_through_service_url.unwrap_or(false)
                    || target.as_ref().is_none_or(|t| *t == at);
                if stay {
                    return Ok(conn);
                }
                let t = target.expect("checked above");
                return Connection::open(&t, token).await;
            }
            Some(proto::LOOKUP_REDIRECT) => {
                let t = target
                    .ok_or_else(|| Error::Protocol("a redirect without a broker URL".into()))?;
                authoritative = r.authoritative.unwrap_or(false);
                if t != at {
                    conn = Connection::open(&t, token).await?;
                    at = t;
                }
            }
            _ => {
                return Err(Error::Server {
                    code: r.error.unwrap_or(0),
                    message: r.message.unwrap_or_else(|| "topic lookup failed".into()),
                });
            }
        }
    }
    Err(Error::Protocol(format!(
        "topic lookup redirected more than {MAX_REDIRECTS} times"
    )))
}
