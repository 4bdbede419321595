//! TLS with rustls and the ring provider — the project's one TLS stack — for both the
//! SQL connections (through tokio-postgres-rustls) and the replication connection.
//!
//! The replication client's own TLS feature would compile rustls with a second crypto
//! provider (aws-lc-rs), so it runs without TLS and this module does the TLS instead:
//! it opens the TCP connection, negotiates `SSLRequest` and the handshake itself, and
//! hands the client a private unix socket (in a fresh 0700 directory, accepted once,
//! removed at once) that is piped to the encrypted stream.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixListener};

use crate::error::ErrorKind;
use crate::{ConnectionConfig, PgError, SslMode};

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The rustls client configuration for `conn`'s sslmode: no verification for
/// `prefer`/`require` (libpq's meaning), chain and host name for `verify-full`.
pub(crate) fn client_config(conn: &ConnectionConfig) -> Result<Arc<ClientConfig>, PgError> {
    let tls_err = |m: String| PgError::new(ErrorKind::Tls, m);
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_err(format!("TLS setup failed: {e}")))?;
    let config = match conn.sslmode {
        SslMode::VerifyFull => {
            let path = conn.sslrootcert.as_deref().ok_or_else(|| {
                PgError::new(ErrorKind::Config, "sslmode verify-full needs sslrootcert")
            })?;
            let mut roots = RootCertStore::empty();
            let certs = CertificateDer::pem_file_iter(path)
                .map_err(|e| tls_err(format!("cannot read sslrootcert {}: {e}", path.display())))?;
            for cert in certs {
                let cert = cert
                    .map_err(|e| tls_err(format!("bad certificate in {}: {e}", path.display())))?;
                roots
                    .add(cert)
                    .map_err(|e| tls_err(format!("unusable CA in {}: {e}", path.display())))?;
            }
            if roots.is_empty() {
                return Err(tls_err(format!("no certificates in {}", path.display())));
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        _ => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerification(provider())))
            .with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

/// The connector for tokio-postgres SQL connections.
pub(crate) fn sql_connector(
    conn: &ConnectionConfig,
) -> Result<tokio_postgres_rustls::MakeRustlsConnect, PgError> {
    Ok(tokio_postgres_rustls::MakeRustlsConnect::new(
        (*client_config(conn)?).clone(),
    ))
}

/// `sslmode=require`/`prefer`: encrypt, but accept any certificate (what libpq does);
/// handshake signatures are still checked.
#[derive(Debug)]
struct NoVerification(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// A replication connection's transport, ready for the replication client.
#[derive(Debug)]
pub(crate) enum Transport {
    /// Connect directly to `host:port` (no TLS, or a unix socket).
    Direct,
    /// Connect to the unix socket in `dir` (named for `port`): a bridge to the TLS
    /// stream.
    Bridged {
        /// The socket directory.
        dir: PathBuf,
    },
}

/// Opens the replication transport for `conn`: direct for `disable` and unix sockets,
/// through a TLS bridge otherwise (`prefer` connects directly when the server declines
/// TLS).
pub(crate) async fn replication_transport(
    conn: &ConnectionConfig,
    tls: Option<&Arc<ClientConfig>>,
) -> Result<Transport, PgError> {
    let Some(tls) = tls.filter(|_| conn.sslmode != SslMode::Disable && !conn.is_unix_socket())
    else {
        return Ok(Transport::Direct);
    };
    let connect = TcpStream::connect((conn.host.as_str(), conn.port));
    let mut tcp = tokio::time::timeout(conn.connect_timeout, connect)
        .await
        .map_err(|_| {
            PgError::new(
                ErrorKind::Connection,
                format!("connecting to {}:{} timed out", conn.host, conn.port),
            )
        })?
        .map_err(|e| {
            PgError::new(
                ErrorKind::Connection,
                format!("cannot connect to {}:{}", conn.host, conn.port),
            )
            .with_source(e)
        })?;
    let _ = tcp.set_nodelay(true);
    // SSLRequest: length 8, code 80877103.
    let io = |e: std::io::Error| {
        PgError::new(ErrorKind::Connection, "TLS negotiation failed").with_source(e)
    };
    tcp.write_all(&[0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f])
        .await
        .map_err(io)?;
    let mut answer = [0u8; 1];
    tcp.read_exact(&mut answer).await.map_err(io)?;
    match answer[0] {
        b'S' => {}
        // Plain it is: the client connects again without TLS rather than through a
        // bridge that would copy every byte once more. The server closes this probe
        // quietly: a connection that ends after its SSL answer is not logged.
        b'N' if conn.sslmode == SslMode::Prefer => return Ok(Transport::Direct),
        b'N' => {
            return Err(PgError::new(
                ErrorKind::Tls,
                format!(
                    "sslmode={:?} but the server does not accept TLS connections",
                    conn.sslmode
                ),
            ));
        }
        other => {
            return Err(PgError::new(
                ErrorKind::Protocol,
                format!("unexpected answer 0x{other:02x} to SSLRequest"),
            ));
        }
    }
    let name = ServerName::try_from(conn.host.clone()).map_err(|e| {
        PgError::new(
            ErrorKind::Tls,
            format!("{:?} is not a valid TLS server name", conn.host),
        )
        .with_source(e)
    })?;
    let connector = tokio_rustls::TlsConnector::from(Arc::clone(tls));
    let stream = connector.connect(name, tcp).await.map_err(|e| {
        PgError::new(ErrorKind::Tls, "TLS handshake with the server failed").with_source(e)
    })?;
    let dir = private_socket_dir().map_err(|e| {
        PgError::new(ErrorKind::Connection, "cannot create the TLS bridge socket").with_source(e)
    })?;
    let socket = dir.join(format!(".s.PGSQL.{}", conn.port));
    let listener = UnixListener::bind(&socket).map_err(|e| {
        let _ = std::fs::remove_dir_all(&dir);
        PgError::new(ErrorKind::Connection, "cannot bind the TLS bridge socket").with_source(e)
    })?;
    tokio::spawn(pipe(listener, dir.clone(), stream));
    Ok(Transport::Bridged { dir })
}

/// Accepts the replication client's one connection, removes the socket, and pipes
/// bytes both ways until either side closes.
async fn pipe<S>(listener: UnixListener, dir: PathBuf, mut server: S)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let accepted = tokio::time::timeout(Duration::from_secs(30), listener.accept()).await;
    drop(listener);
    let _ = std::fs::remove_dir_all(&dir);
    if let Ok(Ok((mut client, _))) = accepted {
        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
        let _ = server.shutdown().await;
    }
}

/// A fresh directory only this user can enter.
fn private_socket_dir() -> std::io::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let base: &Path = Path::new("/tmp");
    let dir = base.join(format!(
        "freshen-tls-{}-{}-{nanos}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use freshen_testenv::PgServer;

    use super::*;

    /// The transport chosen against a real server for `sslmode`.
    async fn transport(pg: &PgServer, sslmode: &str) -> Result<Transport, PgError> {
        let conn = ConnectionConfig::from_url(&format!("{}?sslmode={sslmode}", pg.url()))?;
        replication_transport(&conn, Some(&client_config(&conn)?)).await
    }

    #[tokio::test]
    async fn prefer_connects_directly_to_a_server_without_tls_and_require_refuses_it() {
        let pg = PgServer::start().expect("PostgreSQL for this test");
        assert!(matches!(
            transport(&pg, "prefer").await,
            Ok(Transport::Direct)
        ));
        let err = transport(&pg, "require")
            .await
            .expect_err("require refused");
        assert_eq!(err.kind(), ErrorKind::Tls, "{err}");
    }

    #[tokio::test]
    async fn prefer_bridges_a_server_that_accepts_tls() {
        let pg = PgServer::builder()
            .tls(true)
            .start()
            .expect("PostgreSQL with TLS for this test");
        match transport(&pg, "prefer").await {
            Ok(Transport::Bridged { dir }) => {
                let socket = dir.join(format!(".s.PGSQL.{}", pg.port()));
                let bridged = socket.exists();
                // The bridge removes it once the client connects; this one never does.
                let _ = std::fs::remove_dir_all(&dir);
                assert!(bridged, "no bridge socket at {}", socket.display());
            }
            other => panic!("expected a TLS bridge, got {other:?}"),
        }
    }
}
