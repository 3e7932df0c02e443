//! Object stores: `file://` plus `s3://`, `gs://`, `az://` / `abfs://` and `http(s)://` created on
//! first use from the usual environment variables.
//!
//! | scheme | built with | credentials / settings |
//! |---|---|---|
//! | `s3://bucket` | `AmazonS3Builder::from_env` | `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION` (default `us-east-1`), `AWS_ENDPOINT_URL` (S3-compatible servers; `http://` endpoints are allowed) |
//! | `gs://bucket` | `GoogleCloudStorageBuilder::from_env` | `GOOGLE_SERVICE_ACCOUNT`, `GOOGLE_APPLICATION_CREDENTIALS` |
//! | `az://container` | `MicrosoftAzureBuilder::from_env` | `AZURE_STORAGE_ACCOUNT_NAME`, `AZURE_STORAGE_ACCOUNT_KEY`, … |
//! | `http(s)://host` | `HttpBuilder` | – |
//!
//! Transient errors (connection failures, timeouts, 5xx, throttling) are retried with
//! exponential backoff (100 ms, doubling, at most 5 s apart) up to `EPIFUSION_RETRY_MAX`
//! retries [10] within `EPIFUSION_RETRY_TIMEOUT_S` seconds [60] of the first attempt; then the
//! request fails with an error that names the retries made. See [`retry_config`].

use std::sync::Arc;

use datafusion::common::{exec_datafusion_err, Result as DfResult};
use datafusion::execution::object_store::{DefaultObjectStoreRegistry, ObjectStoreRegistry};
use object_store::aws::AmazonS3Builder;
use object_store::azure::MicrosoftAzureBuilder;
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::http::HttpBuilder;
use object_store::{BackoffConfig, ClientOptions, ObjectStore, RetryConfig};
use url::Url;

/// A registry that creates cloud object stores lazily from the environment.
#[derive(Debug, Default)]
pub struct EnvObjectStoreRegistry {
    inner: DefaultObjectStoreRegistry,
}

impl EnvObjectStoreRegistry {
    /// A registry with only the local file system registered.
    pub fn new() -> Self {
        Self::default()
    }
}

/// The retry policy of every cloud store (see the module docs): bounded in count and in total
/// time, so that a server that went away gives a clear error instead of a hang.
pub fn retry_config() -> RetryConfig {
    let env = |k: &str| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.trim().parse::<f64>().ok())
    };
    let max_retries = env("EPIFUSION_RETRY_MAX").map_or(10, |v| v.max(0.0) as usize);
    let timeout = env("EPIFUSION_RETRY_TIMEOUT_S").map_or(60.0, |v| v.max(0.0));
    RetryConfig {
        backoff: BackoffConfig {
            init_backoff: std::time::Duration::from_millis(100),
            max_backoff: std::time::Duration::from_secs(5),
            base: 2.0,
        },
        max_retries,
        retry_timeout: std::time::Duration::from_secs_f64(timeout),
    }
}

/// URL schemes of the stores above (and `file://`).
pub const URL_SCHEMES: &[&str] = &[
    "file", "s3", "s3a", "gs", "az", "abfs", "abfss", "azure", "http", "https",
];

/// Check a store location given by a person before it is used: not empty, and a folder or a
/// URL with one of [`URL_SCHEMES`]. Err is the message (the caller names the location).
pub fn check_location(location: &str) -> Result<(), String> {
    if location.trim().is_empty() {
        return Err("the location is empty: give a folder or a URL".into());
    }
    if let Some((scheme, _)) = location.split_once("://") {
        if !URL_SCHEMES.contains(&scheme.to_ascii_lowercase().as_str()) {
            return Err(format!(
                "unsupported URL scheme `{scheme}://` (use a folder, or a file://, s3://, gs://, \
                 az:// or http(s):// URL)"
            ));
        }
    }
    Ok(())
}

/// Build the object store for `url` from the environment (`None` for local paths).
pub fn store_from_env(url: &Url) -> DfResult<Option<Arc<dyn ObjectStore>>> {
    let bucket = url.host_str().unwrap_or_default();
    let store: Arc<dyn ObjectStore> = match url.scheme() {
        "s3" | "s3a" => {
            let mut b = AmazonS3Builder::from_env()
                .with_bucket_name(bucket)
                .with_retry(retry_config());
            if std::env::var("AWS_REGION").is_err() && std::env::var("AWS_DEFAULT_REGION").is_err()
            {
                b = b.with_region("us-east-1");
            }
            if let Ok(endpoint) =
                std::env::var("AWS_ENDPOINT_URL").or_else(|_| std::env::var("AWS_ENDPOINT"))
            {
                let http = endpoint.starts_with("http://");
                b = b.with_endpoint(endpoint).with_allow_http(http);
                if http {
                    b = b.with_virtual_hosted_style_request(false);
                }
            }
            Arc::new(
                b.build()
                    .map_err(|e| exec_datafusion_err!("s3://{bucket}: {e}"))?,
            )
        }
        "gs" => Arc::new(
            GoogleCloudStorageBuilder::from_env()
                .with_bucket_name(bucket)
                .with_retry(retry_config())
                .build()
                .map_err(|e| exec_datafusion_err!("gs://{bucket}: {e}"))?,
        ),
        "az" | "abfs" | "abfss" | "azure" => Arc::new(
            MicrosoftAzureBuilder::from_env()
                .with_url(url.as_str())
                .with_retry(retry_config())
                .build()
                .map_err(|e| exec_datafusion_err!("{url}: {e}"))?,
        ),
        "http" | "https" => {
            let base = format!("{}://{}", url.scheme(), url.authority());
            Arc::new(
                HttpBuilder::new()
                    .with_url(base.clone())
                    .with_retry(retry_config())
                    .with_client_options(ClientOptions::new().with_allow_http(true))
                    .build()
                    .map_err(|e| exec_datafusion_err!("{base}: {e}"))?,
            )
        }
        _ => return Ok(None),
    };
    Ok(Some(store))
}

impl ObjectStoreRegistry for EnvObjectStoreRegistry {
    fn register_store(
        &self,
        url: &Url,
        store: Arc<dyn ObjectStore>,
    ) -> Option<Arc<dyn ObjectStore>> {
        self.inner.register_store(url, store)
    }

    fn deregister_store(&self, url: &Url) -> DfResult<Arc<dyn ObjectStore>> {
        self.inner.deregister_store(url)
    }

    fn get_store(&self, url: &Url) -> DfResult<Arc<dyn ObjectStore>> {
        if let Ok(store) = self.inner.get_store(url) {
            return Ok(store);
        }
        match store_from_env(url)? {
            Some(store) => {
                self.inner.register_store(url, store.clone());
                Ok(store)
            }
            None => self.inner.get_store(url),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_are_checked_before_use() {
        for ok in [
            "data/gibleed",
            "/abs",
            "file:///x",
            "s3://b/p",
            "HTTPS://h/x",
            "az://c",
        ] {
            assert_eq!(check_location(ok), Ok(()), "{ok}");
        }
        for bad in ["ftp://h/x", "foo://", "hdfs://nn/p"] {
            let e = check_location(bad).unwrap_err();
            assert!(e.contains("unsupported URL scheme"), "{bad}: {e}");
        }
        assert!(check_location("").unwrap_err().contains("empty"));
        assert!(check_location("  ").unwrap_err().contains("empty"));
    }
}
