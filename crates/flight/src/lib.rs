//! `epifusion serve`: an Arrow Flight SQL server over epifusion sessions.
//!
//! * [`sessions`]: one DataFusion session per client connection (its own views, `SET` options
//!   and design matrices) over the catalog of the start-up session (`--omop`, `-c`);
//! * [`service`]: arrow-flight's `FlightSqlService`: statements and prepared statements
//!   (`GetFlightInfo` plans, `DoGet` runs), updates (`DoPut`), catalog metadata;
//! * [`connection`]: accepted connections (a connection's end closes its session) and the
//!   bearer-token check.
//!
//! Client statements are read-only (no DDL, DML, COPY or SET) unless the server runs with
//! `allow_writes`. Each statement's planning and result stream stop at the time limit; one
//! DataFusion memory pool bounds what DataFusion's operators hold across every client (sorts,
//! joins, hash aggregates, the `*_fit_agg` accumulators, which report their rows to the pool).
//! A fit table function's design matrix (its collected input, roughly 16 bytes per non-zero
//! covariate value plus 24 bytes per row) is not drawn from the pool: it is bounded by the
//! input query's size, and the time limit stops the fit.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arrow_flight::flight_service_server::FlightServiceServer;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::prelude::SessionContext;
use tonic::transport::{Identity, Server, ServerTlsConfig};

pub mod connection;
pub mod service;
pub mod sessions;

use connection::TokenCheck;
use service::EpifusionFlightSql;
use sessions::Sessions;

/// Errors starting the server.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// No token on an address other clients can reach.
    #[error(
        "--token (or EPIFUSION_TOKEN) is required; --insecure serves without one on a loopback \
         address only (127.0.0.1, ::1), not on {0}"
    )]
    TokenRequired(SocketAddr),
    /// A TLS file that cannot be read or holds no PEM of the expected kind.
    #[error("TLS {what} {}: {reason}", path.display())]
    Tls {
        /// `certificate` or `key`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The address cannot be bound (in use, not local, no permission).
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// Setting up the runtime (memory pool) or the gRPC server failed.
    #[error("{0}")]
    Setup(String),
}

/// TLS from PEM files.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The certificate chain (PEM).
    pub cert: PathBuf,
    /// The private key (PEM).
    pub key: PathBuf,
}

/// How the server runs.
///
/// | option | default | what |
/// |---|---|---|
/// | `bind` | — | address to listen on (`127.0.0.1:50051`) |
/// | `token` | none | bearer token every call must carry; required unless `insecure` on loopback |
/// | `insecure` | false | serve without a token (loopback addresses only) |
/// | `allow_writes` | false | let clients run DDL, DML, COPY and SET |
/// | `tls` | none | serve TLS with this certificate and key |
/// | `query_timeout` | none | stop a statement (planning, then its results) after this long |
/// | `memory_limit` | none | bytes of the DataFusion memory pool shared by every client |
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Address to listen on.
    pub bind: SocketAddr,
    /// Bearer token.
    pub token: Option<String>,
    /// Serve without a token (loopback only).
    pub insecure: bool,
    /// Let clients change tables and settings.
    pub allow_writes: bool,
    /// TLS certificate and key.
    pub tls: Option<TlsFiles>,
    /// Per-statement time limit.
    pub query_timeout: Option<Duration>,
    /// Memory pool size in bytes.
    pub memory_limit: Option<usize>,
}

impl ServeOptions {
    /// Refuse a server without a token that is reachable from other machines.
    pub fn check(&self) -> Result<(), ServeError> {
        let has_token = self.token.as_deref().is_some_and(|t| !t.is_empty());
        let insecure_loopback = self.insecure && self.bind.ip().is_loopback();
        if !(has_token || insecure_loopback) {
            return Err(ServeError::TokenRequired(self.bind));
        }
        Ok(())
    }
}

/// Read a PEM file that must contain `marker` (`CERTIFICATE`, `PRIVATE KEY`).
fn read_pem(what: &'static str, path: &PathBuf, marker: &str) -> Result<Vec<u8>, ServeError> {
    let tls_error = |reason: String| ServeError::Tls {
        what,
        path: path.clone(),
        reason,
    };
    let pem = std::fs::read(path).map_err(|e| tls_error(e.to_string()))?;
    let text = String::from_utf8_lossy(&pem);
    if !text.contains("-----BEGIN") || !text.contains(marker) {
        return Err(tls_error(format!("no PEM {marker} in the file")));
    }
    Ok(pem)
}

/// A bound server, ready to [`Server::run`].
pub struct FlightServer {
    listener: tokio::net::TcpListener,
    sessions: Arc<Sessions>,
    router: tonic::transport::server::Router,
}

impl FlightServer {
    /// Check the options, read the TLS files and bind the address. `base` is the start-up
    /// session (its catalog is shared by every client); the clients' sessions copy its settings.
    pub async fn bind(base: SessionContext, opts: &ServeOptions) -> Result<Self, ServeError> {
        opts.check()?;
        let mut runtime = RuntimeEnvBuilder::from_runtime_env(base.runtime_env().as_ref());
        if let Some(limit) = opts.memory_limit {
            runtime = runtime.with_memory_limit(limit, 1.0);
        }
        let runtime = runtime
            .build_arc()
            .map_err(|e| ServeError::Setup(e.strip_backtrace()))?;
        let sessions = Arc::new(Sessions::new(base, runtime));
        let service =
            EpifusionFlightSql::new(sessions.clone(), opts.allow_writes, opts.query_timeout);
        let check = TokenCheck::new(opts.token.as_deref().filter(|t| !t.is_empty()));
        let svc = FlightServiceServer::with_interceptor(service, move |r| check.check(r));
        let mut builder = Server::builder();
        if let Some(tls) = &opts.tls {
            let cert = read_pem("certificate", &tls.cert, "CERTIFICATE")?;
            let key = read_pem("key", &tls.key, "PRIVATE KEY")?;
            builder = builder
                .tls_config(ServerTlsConfig::new().identity(Identity::from_pem(cert, key)))
                .map_err(|e| {
                    ServeError::Setup(format!(
                        "cannot use TLS certificate {} with key {}: {e}",
                        tls.cert.display(),
                        tls.key.display()
                    ))
                })?;
        }
        let router = builder.add_service(svc);
        let listener = tokio::net::TcpListener::bind(opts.bind)
            .await
            .map_err(|source| ServeError::Bind {
                addr: opts.bind,
                source,
            })?;
        Ok(Self {
            listener,
            sessions,
            router,
        })
    }

    /// The bound address (the port when `bind` asked for port 0).
    pub fn local_addr(&self) -> Result<SocketAddr, ServeError> {
        self.listener
            .local_addr()
            .map_err(|e| ServeError::Setup(e.to_string()))
    }

    /// Serve until `shutdown` completes.
    pub async fn run(
        self,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Result<(), ServeError> {
        let incoming = connection::incoming(self.listener, self.sessions);
        self.router
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await
            .map_err(|e| ServeError::Setup(format!("the server stopped: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(bind: &str, token: Option<&str>, insecure: bool) -> ServeOptions {
        ServeOptions {
            bind: bind.parse().unwrap(),
            token: token.map(str::to_string),
            insecure,
            allow_writes: false,
            tls: None,
            query_timeout: None,
            memory_limit: None,
        }
    }

    #[test]
    fn a_token_is_required_unless_insecure_on_loopback() {
        assert!(opts("0.0.0.0:1", Some("t"), false).check().is_ok());
        assert!(opts("127.0.0.1:1", None, true).check().is_ok());
        assert!(opts("[::1]:1", None, true).check().is_ok());
        for (bind, token, insecure) in [
            ("127.0.0.1:1", None, false),
            ("127.0.0.1:1", Some(""), false),
            ("0.0.0.0:1", None, true),
            ("192.168.1.5:1", None, true),
        ] {
            let e = opts(bind, token, insecure).check().unwrap_err();
            assert!(e.to_string().contains("--token"), "{bind}: {e}");
        }
    }

    #[test]
    fn a_tls_file_without_pem_is_named() {
        let path =
            std::env::temp_dir().join(format!("epifusion-flight-{}.pem", std::process::id()));
        std::fs::write(&path, "not PEM").unwrap();
        let e = read_pem("certificate", &path, "CERTIFICATE").unwrap_err();
        assert!(e.to_string().contains(&path.display().to_string()), "{e}");
        std::fs::remove_file(&path).unwrap();
        let e = read_pem("key", &path, "PRIVATE KEY").unwrap_err();
        assert!(e.to_string().contains("key"), "{e}");
    }
}
