//! One active `mysql-incremental` process per source name: a named lock held by a
//! session of its own. The server frees a session's named locks when the session ends,
//! so a killed process hands over as soon as its connection is gone.

use std::time::Duration;

use freshen::BoxError;
use freshen::plug::Lease;
use mysql_async::prelude::Queryable;

use crate::MySqlError;

/// How often the holder checks it still holds the lock (a session the server killed, a
/// broken connection).
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// The lock's name for source `name`: at most 64 characters, the servers' limit.
fn lock_name(name: &str) -> String {
    let full = format!("freshen:mysql-incremental:{name}");
    if full.len() <= 64 {
        return full;
    }
    // A long name keeps its start and a hash of the whole, so two long names sharing a
    // prefix stay apart.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in full.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    let head: String = full.chars().take(47).collect();
    format!("{head}:{h:016x}")
}

/// Tries once to take the lock of source `name` on the server at `url`.
pub async fn try_acquire(url: &str, name: &str) -> Result<Lease, MySqlError> {
    let key = lock_name(name);
    let opts = crate::server::opts(url)?;
    let mut conn = crate::server::connect(&opts, "the standby lock").await?;
    let got: Option<Option<i64>> = conn
        .exec_first("SELECT GET_LOCK(?, 0)", (&key,))
        .await
        .map_err(|e| MySqlError::driver("cannot take the standby lock", e))?;
    if got.flatten() != Some(1) {
        let holder: Option<Option<u64>> = conn
            .exec_first("SELECT IS_USED_LOCK(?)", (&key,))
            .await
            .map_err(|e| MySqlError::driver("cannot read the standby lock", e))?;
        let _ = conn.disconnect().await;
        return Ok(Lease::Held(match holder.flatten() {
            Some(id) => format!("the session {id} on the cursor store's server"),
            None => "another process".to_owned(),
        }));
    }
    Ok(Lease::Granted(Box::pin(async move {
        loop {
            tokio::time::sleep(CHECK_EVERY).await;
            let mine: Result<Option<Option<i64>>, _> = conn
                .exec_first("SELECT IS_USED_LOCK(?) = CONNECTION_ID()", (&key,))
                .await;
            match mine {
                Ok(Some(Some(1))) => {}
                Ok(_) => return BoxError::from("the standby lock was taken from this session"),
                Err(e) => {
                    return BoxError::from(format!(
                        "the session holding the standby lock ended: {e}"
                    ));
                }
            }
        }
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_names_fit_the_servers_limit_and_stay_apart() {
        assert_eq!(lock_name("rollups"), "freshen:mysql-incremental:rollups");
        let a = lock_name(&"a".repeat(100));
        let b = lock_name(&format!("{}b", "a".repeat(99)));
        assert!(a.len() <= 64 && b.len() <= 64);
        assert_ne!(a, b);
    }
}
