//! `epifusion serve`: an Arrow Flight SQL server over epifusion sessions.

use std::net::SocketAddr;
use std::time::Duration;

use super::*;

#[derive(Args, Debug)]
pub(crate) struct ServeArgs {
    /// Address to listen on (HOST:PORT; port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:50051")]
    pub(crate) bind: SocketAddr,
    /// Bearer token every client must send (`authorization: Bearer <token>`); default: the
    /// EPIFUSION_TOKEN environment variable.
    #[arg(long)]
    pub(crate) token: Option<String>,
    /// Serve without a token (allowed on a loopback address only).
    #[arg(long)]
    pub(crate) insecure: bool,
    /// Let clients run DDL, DML, COPY and SET (read-only by default).
    #[arg(long)]
    pub(crate) allow_writes: bool,
    /// TLS certificate chain (PEM); needs --tls-key.
    #[arg(long, requires = "tls_key")]
    pub(crate) tls_cert: Option<PathBuf>,
    /// TLS private key (PEM); needs --tls-cert.
    #[arg(long, requires = "tls_cert")]
    pub(crate) tls_key: Option<PathBuf>,
    /// Stop a statement that runs longer than this many seconds (planning, fit and results).
    #[arg(long)]
    pub(crate) query_timeout: Option<f64>,
    /// DataFusion memory pool shared by every client, e.g. 4G, 512M (sorts, joins, hash
    /// aggregates and *_fit_agg accumulators draw from it).
    #[arg(long, value_parser = parse_bytes)]
    pub(crate) memory_limit: Option<usize>,
    /// Start-up SQL (`;`-separated), run once before serving: CREATE EXTERNAL TABLE, CREATE
    /// VIEW… Its tables are shared by every client.
    #[arg(short = 'c', long = "command")]
    pub(crate) command: Option<String>,
    /// File of start-up SQL statements.
    #[arg(short = 'f', long = "file")]
    pub(crate) file: Option<PathBuf>,
    /// OMOP store (folder, file://, s3://, gs://, az://, http(s):// URL) to register.
    #[arg(long)]
    pub(crate) omop: Option<String>,
    /// DataFusion batch size.
    #[arg(long)]
    pub(crate) batch_size: Option<usize>,
}

/// `4G`, `512M`, `64k` or plain bytes.
fn parse_bytes(s: &str) -> std::result::Result<usize, String> {
    let t = s.trim();
    let (digits, unit) = match t.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => t.split_at(i),
        None => (t, ""),
    };
    let scale: f64 = match unit.to_ascii_lowercase().trim_end_matches(['b', 'i']) {
        "" => 1.0,
        "k" => 1024.0,
        "m" => 1024.0 * 1024.0,
        "g" => 1024.0 * 1024.0 * 1024.0,
        "t" => 1024.0_f64.powi(4),
        _ => return Err(format!("`{s}`: give bytes, or a size such as 512M or 4G")),
    };
    let n: f64 = digits
        .trim()
        .parse()
        .map_err(|_| format!("`{s}`: give bytes, or a size such as 512M or 4G"))?;
    if !(n.is_finite() && n > 0.0) {
        return Err(format!("`{s}`: the memory limit must be positive"));
    }
    Ok((n * scale) as usize)
}

pub(crate) fn run_serve(a: &ServeArgs) -> Result<()> {
    use epifusion::engine::session::{new_session, SessionOptions};
    use epifusion::engine::shell::split_statements;
    use epifusion::flight::{FlightServer, ServeOptions, TlsFiles};
    let startup = match (&a.command, &a.file) {
        (Some(_), Some(_)) => bail!("give either -c or -f, not both"),
        (Some(c), None) => Some(c.clone()),
        (None, Some(f)) => Some(
            std::fs::read_to_string(f).with_context(|| format!("cannot read {}", f.display()))?,
        ),
        (None, None) => None,
    };
    let query_timeout = match a.query_timeout {
        Some(s) if !(s.is_finite() && s > 0.0) => bail!("--query-timeout must be positive"),
        Some(s) => Some(Duration::from_secs_f64(s)),
        None => None,
    };
    let opts = ServeOptions {
        bind: a.bind,
        token: a
            .token
            .clone()
            .or_else(|| std::env::var("EPIFUSION_TOKEN").ok()),
        insecure: a.insecure,
        allow_writes: a.allow_writes,
        tls: match (&a.tls_cert, &a.tls_key) {
            (Some(cert), Some(key)) => Some(TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
            }),
            _ => None,
        },
        query_timeout,
        memory_limit: a.memory_limit,
    };
    opts.check()?;
    let rt = runtime()?;
    rt.block_on(async {
        let base = new_session(&SessionOptions {
            omop: a.omop.clone(),
            batch_size: a.batch_size,
        })
        .await?;
        for statement in split_statements(startup.as_deref().unwrap_or("")) {
            base.sql(&statement)
                .await
                .with_context(|| format!("start-up statement failed: {statement}"))?
                .collect()
                .await
                .with_context(|| format!("start-up statement failed: {statement}"))?;
        }
        let server = FlightServer::bind(base, &opts).await?;
        let addr = server.local_addr()?;
        let scheme = if opts.tls.is_some() {
            "grpc+tls"
        } else {
            "grpc"
        };
        eprintln!(
            "epifusion serve: Flight SQL on {scheme}://{addr} ({}, {})",
            if opts.allow_writes {
                "writes allowed"
            } else {
                "read-only"
            },
            if opts.token.as_deref().is_some_and(|t| !t.is_empty()) {
                "bearer token required"
            } else {
                "no token"
            }
        );
        // Runs until the process is stopped (Ctrl-C, SIGTERM).
        server.run(std::future::pending()).await?;
        Ok::<(), anyhow::Error>(())
    })
}

#[cfg(test)]
mod tests {
    use super::parse_bytes;

    #[test]
    fn memory_sizes_parse() {
        assert_eq!(parse_bytes("1024"), Ok(1024));
        assert_eq!(parse_bytes("2k"), Ok(2048));
        assert_eq!(parse_bytes("512M"), Ok(512 << 20));
        assert_eq!(parse_bytes("4GiB"), Ok(4 << 30));
        assert!(parse_bytes("4X").is_err());
        assert!(parse_bytes("-1G").is_err());
    }
}
