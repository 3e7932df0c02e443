//! Client connections: each accepted TCP stream carries an id (the key of its session) and
//! closes its session when the connection ends; the bearer-token check.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tonic::transport::server::{Connected, TlsConnectInfo};
use tonic::{Request, Status};

use crate::sessions::Sessions;

/// What a request knows about its connection (a tonic request extension).
#[derive(Debug, Clone, Copy)]
pub struct ClientInfo {
    /// The connection's id: the key of its session.
    pub id: u64,
    /// The client's address.
    pub remote: SocketAddr,
}

/// The connection a request came on (plain or TLS).
pub fn client_info<T>(request: &Request<T>) -> Option<ClientInfo> {
    let ext = request.extensions();
    ext.get::<ClientInfo>().copied().or_else(|| {
        ext.get::<TlsConnectInfo<ClientInfo>>()
            .map(|t| *t.get_ref())
    })
}

/// An accepted client connection; dropping it (the connection ended) closes its session.
pub struct ClientStream {
    stream: TcpStream,
    info: ClientInfo,
    sessions: Arc<Sessions>,
}

impl Drop for ClientStream {
    fn drop(&mut self) {
        self.sessions.close(self.info.id);
    }
}

impl Connected for ClientStream {
    type ConnectInfo = ClientInfo;

    fn connect_info(&self) -> ClientInfo {
        self.info
    }
}

impl AsyncRead for ClientStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for ClientStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// The accepted connections of `listener`, numbered. An accept error (too many open files, a
/// connection reset before it was accepted) is reported and the listener keeps going.
pub fn incoming(
    listener: TcpListener,
    sessions: Arc<Sessions>,
) -> impl Stream<Item = io::Result<ClientStream>> {
    let next_id = Arc::new(AtomicU64::new(1));
    futures::stream::unfold(listener, move |listener| {
        let (sessions, next_id) = (sessions.clone(), next_id.clone());
        async move {
            loop {
                match listener.accept().await {
                    Ok((stream, remote)) => {
                        let _ = stream.set_nodelay(true);
                        let info = ClientInfo {
                            id: next_id.fetch_add(1, Ordering::Relaxed),
                            remote,
                        };
                        let client = ClientStream {
                            stream,
                            info,
                            sessions,
                        };
                        return Some((Ok(client), listener));
                    }
                    Err(e) => {
                        eprintln!("epifusion serve: cannot accept a connection: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        }
    })
}

/// The bearer-token check of every call (a tonic interceptor): `authorization: Bearer <token>`.
#[derive(Clone)]
pub struct TokenCheck {
    token: Option<Arc<str>>,
}

impl TokenCheck {
    /// Require `token` (none: every call is let through).
    pub fn new(token: Option<&str>) -> Self {
        Self {
            token: token.map(Arc::from),
        }
    }

    /// Let `request` through when it carries the token.
    #[allow(clippy::result_large_err)] // tonic's interceptor signature
    pub fn check(&self, request: Request<()>) -> Result<Request<()>, Status> {
        let Some(token) = &self.token else {
            return Ok(request);
        };
        let given = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })
            .map(str::trim);
        match given {
            Some(g) if same_bytes(g.as_bytes(), token.as_bytes()) => Ok(request),
            Some(_) => Err(Status::unauthenticated("wrong bearer token")),
            None => Err(Status::unauthenticated(
                "this server needs a bearer token (`authorization: Bearer <token>` header)",
            )),
        }
    }
}

/// Compare in time independent of where the first difference is.
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_header(value: Option<&str>) -> Request<()> {
        let mut r = Request::new(());
        if let Some(v) = value {
            r.metadata_mut().insert("authorization", v.parse().unwrap());
        }
        r
    }

    #[test]
    fn the_token_is_required_and_compared_exactly() {
        let check = TokenCheck::new(Some("s3cret"));
        assert!(check.check(with_header(Some("Bearer s3cret"))).is_ok());
        for bad in [
            None,
            Some("Bearer s3cre"),
            Some("Bearer s3cret2"),
            Some("Basic s3cret"),
        ] {
            let e = check.check(with_header(bad)).unwrap_err();
            assert_eq!(e.code(), tonic::Code::Unauthenticated, "{bad:?}");
        }
        assert!(TokenCheck::new(None).check(with_header(None)).is_ok());
    }
}
